"""Which tokens are masked: masking units built from word ids, then whole-unit masking at the exact rate.

Units: :func:`whole_word_mask` masks whole *units*, where a unit is whatever the word-id tensor groups.
Changing the unit (:func:`masking_units`) changes the masking scheme without touching the sampler, so every
scheme keeps its properties (expected rate exactly ``mlm_probability``, reproducible randomness):

- ``whole_word``: a unit is a jieba word (the word ids as they are);
- ``ngram``: a unit is a span of 1-4 consecutive words, lengths drawn at 40/30/20/10% (MacBERT-style
  n-gram masking). Each example's words are partitioned into such spans, so a span is a union of whole words.
  MacBERT samples a span around each chosen word instead; a partition keeps the exact-rate sampler as is. In
  a packed block a span may join the last words of one document and the first of the next;
- ``token``: a unit is a single token (character-level masking, the ablation of whole-word masking).

Sampling rule (per example): let ``n`` be the number of maskable tokens (not ``[CLS]``/``[SEP]``/padding or
other special tokens) and ``target = mlm_probability * n``. Units are visited in a random order and
selected while the running token count stays within ``target``; the unit that would cross it is selected
with probability ``(target - covered) / len(unit)``. The expected number of masked tokens is therefore
exactly ``target`` (no rounding bias, short examples included), and a unit is always masked whole.

Each selected unit is then replaced by ``[MASK]`` (``mask_replace_prob``), by random ordinary vocabulary
tokens (``random_replace_prob``) or kept. ``attention_mask`` is 1 on every real token -- ``[MASK]``
included -- and 0 on padding only.

Randomness comes from :mod:`mlm_adapt.masking.hashing`: a pure function of the example, so validation
examples (always drawn with epoch 0) get the same masks at every evaluation. Units are visited in the order
of their random keys, ties (rare: 24-bit keys) broken by index.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.masking.hashing import derive_keys, key_array, uniform, uniform_at_np, uniform_np

MaskingScheme = Literal["whole_word", "ngram", "token"]
# What each scheme masks together, in the words a model card uses (short name, then the unit).
SCHEME_DESCRIPTIONS: dict[str, tuple[str, str]] = {
    "whole_word": ("Chinese whole-word masking", "all tokens of a segmented word are masked together"),
    "ngram": (
        "Chinese n-gram whole-word masking",
        "spans of 1-4 whole segmented words (40/30/20/10%) are masked together, MacBERT-style",
    ),
    "token": ("token-level masking", "every token is masked on its own (character masking for Chinese)"),
}

# MacBERT's n-gram length distribution for n = 1, 2, 3, 4.
NGRAM_PROBABILITIES = (0.4, 0.3, 0.2, 0.1)
# Salt that gives the span-length draws their own key stream, disjoint from the streams of whole_word_mask.
_NGRAM_SALT = 0x5BD1E995


def ngram_units(
    word_ids: torch.Tensor, keys: torch.Tensor, probabilities: tuple[float, ...] = NGRAM_PROBABILITIES
) -> torch.Tensor:
    """Groups consecutive words (``(B, L)`` compact ids, ``-1`` on specials and padding) into spans of
    1, 2, ... words drawn with ``probabilities``, from the examples' ``keys``: compact span ids, ``-1``
    where ``word_ids`` is ``-1``."""
    length = word_ids.shape[1]
    cdf = torch.tensor(probabilities, dtype=torch.float64).cumsum(0)
    cdf = (cdf / cdf[-1]).to(torch.float32)
    # One span length per slot; at most L spans are needed since every span holds at least one word.
    draws = uniform(derive_keys(keys, _NGRAM_SALT), length, 0)
    span_len = torch.searchsorted(cdf, draws.contiguous(), right=True).clamp(max=len(probabilities) - 1) + 1
    span_end = span_len.cumsum(1)  # exclusive end (in words) of each span
    span = torch.searchsorted(span_end, word_ids.clamp(min=0).contiguous(), right=True)
    return torch.where(word_ids >= 0, span, -1)


def token_units(word_ids: torch.Tensor) -> torch.Tensor:
    """Makes every token its own unit (character-level masking for Chinese): the position is the unit id."""
    positions = torch.arange(word_ids.shape[1], dtype=word_ids.dtype, device=word_ids.device)
    return torch.where(word_ids >= 0, positions[None, :].expand_as(word_ids), -1)


def masking_units(word_ids: torch.Tensor, keys: torch.Tensor, scheme: MaskingScheme) -> torch.Tensor:
    """Unit ids to hand to :func:`whole_word_mask` for a masking scheme."""
    if scheme == "whole_word":
        return word_ids
    if scheme == "ngram":
        return ngram_units(word_ids, keys)
    if scheme == "token":
        return token_units(word_ids)
    raise ValueError(f"unknown masking scheme {scheme!r}")


def _word_order(order_key: np.ndarray, present: np.ndarray) -> torch.Tensor:
    """Word indices of each row sorted by ``order_key``, present words first, ties broken by index.

    Keys are multiples of 2**-24, so ``key * 2**24 * W + index`` is an exact int64 sort key: one integer
    sort orders by key and breaks ties by index (a stable order, the same on every platform).
    """
    width = order_key.shape[1]
    bits = (order_key * (1 << 24)).astype(np.int64)
    bits[~present] = 1 << 25  # absent word slots after every present word
    composite = bits * width + np.arange(width, dtype=np.int64)
    composite.sort(axis=1)
    return torch.from_numpy(composite % width)


def whole_word_mask(
    input_ids: torch.Tensor,
    word_ids: torch.Tensor,
    keys: torch.Tensor,
    *,
    mask_token_id: int,
    random_token_ids: torch.Tensor,
    special_token_ids: torch.Tensor,
    mlm_probability: float | torch.Tensor = 0.15,
    mask_replace_prob: float = 0.8,
    random_replace_prob: float = 0.1,
    maskable: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks whole words of a padded batch.

    Args:
        input_ids: ``(B, L)`` token ids.
        word_ids: ``(B, L)`` compact word ids per example, ``-1`` on special and pad tokens.
        keys: ``(B,)`` per-example random keys (:func:`example_keys`).
        mask_token_id: Id of ``[MASK]``.
        random_token_ids: Ids random replacements are drawn from.
        special_token_ids: Ids that are never masked, whatever their word id.
        mlm_probability: Expected fraction of maskable tokens to predict: one rate, or a ``(B, 1)`` float
            tensor of per-example rates.
        mask_replace_prob: Fraction of selected words replaced by ``[MASK]``.
        random_replace_prob: Fraction of selected words replaced by random tokens (the rest are kept).
        maskable: ``(B, L)`` tokens that may be masked, when the caller has them already: word id >= 0 and
            not in ``special_token_ids``.

    Returns:
        ``(masked_input_ids, labels)``; labels are -100 except at selected positions.
    """
    batch = input_ids.shape[0]
    if maskable is None:
        maskable = (word_ids >= 0) & ~torch.isin(input_ids, special_token_ids)
    word_index = word_ids.clamp(min=0)
    # Compact ids never exceed the sequence length; slots above the largest id hold no word, and no sort
    # places them before a present word, so they can be left out without changing any result.
    n_words = int(word_index.max()) + 1 if word_index.numel() else 1
    word_len = torch.zeros(batch, n_words, dtype=torch.int64).scatter_add_(1, word_index, maskable.long())
    target = mlm_probability * word_len.sum(1, keepdim=True)

    keys32 = key_array(keys)
    order = _word_order(uniform_np(keys32, n_words, 0), (word_len > 0).numpy())
    sorted_len = word_len.gather(1, order)
    covered_after = sorted_len.cumsum(1)
    covered_before = covered_after - sorted_len
    crossing_prob = (target - covered_before) / sorted_len.clamp(min=1)
    chosen_sorted = (covered_after <= target) | (
        (covered_before < target) & (torch.from_numpy(uniform_np(keys32, n_words, 1)) < crossing_prob)
    )
    chosen = torch.zeros_like(chosen_sorted).scatter_(1, order, chosen_sorted) & (word_len > 0)

    action = torch.from_numpy(uniform_np(keys32, n_words, 2))
    to_mask_word = chosen & (action < mask_replace_prob)
    to_random_word = (
        chosen & (action >= mask_replace_prob) & (action < mask_replace_prob + random_replace_prob)
    )

    selected = chosen.gather(1, word_index) & maskable
    labels = torch.where(selected, input_ids, -100)
    masked = torch.where(selected & to_mask_word.gather(1, word_index), mask_token_id, input_ids)
    # Random tokens only where they go (~1.5% of positions): the draws of stream 3 at those positions.
    rows, cols = (selected & to_random_word.gather(1, word_index)).nonzero(as_tuple=True)
    if len(rows):
        draws = torch.from_numpy(uniform_at_np(keys32[rows.numpy()], cols.numpy(), 3))
        n_random = len(random_token_ids)
        masked[rows, cols] = random_token_ids[(draws * n_random).long().clamp(max=n_random - 1)]
    return masked, labels


def check_probabilities(mlm_probability: float, mask_replace_prob: float, random_replace_prob: float) -> None:
    """Raises :class:`MLMAdaptError` naming the config key when a masking probability is out of range."""
    if not 0.0 < mlm_probability < 1.0:
        raise MLMAdaptError(f"data.mlm_probability={mlm_probability} must be in (0, 1), e.g. 0.15")
    for key, value in (
        ("mask_replace_prob", mask_replace_prob),
        ("random_replace_prob", random_replace_prob),
    ):
        if not 0.0 <= value <= 1.0:
            raise MLMAdaptError(f"data.{key}={value} must be in [0, 1]")
    if mask_replace_prob + random_replace_prob > 1.0:
        raise MLMAdaptError(
            f"data.mask_replace_prob + data.random_replace_prob = {mask_replace_prob + random_replace_prob}"
            " exceeds 1; lower one of them (default 0.8 / 0.1)"
        )
