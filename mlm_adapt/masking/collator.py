"""The ``collate_fn`` of every mlm_adapt DataLoader: pad a batch, then mask whole units of it.

Read top to bottom: the randomness, the masking units, the exact-rate sampler, the collator.

Randomness is a pure hash of ``(seed, epoch, example_id, position, stream)``, not a stateful generator:
masks are reproducible, independent of batch composition, worker count and world size, new every epoch,
and different across ranks and workers because those see different examples; validation examples (always
epoch 0) get the same masks at every evaluation. It runs on ``uint32`` NumPy arrays, whose multiplication
wraps mod 2**32 natively.

A unit is whatever the word-id tensor groups, so the masking scheme (:func:`masking_units`) changes without
touching the sampler and every scheme keeps its properties (expected rate exactly ``mlm_probability``,
reproducible randomness):

- ``whole_word``: a unit is a jieba word (the word ids as they are);
- ``ngram``: a span of 1-4 consecutive words, lengths drawn at 40/30/20/10% (MacBERT-style). Each example's
  words are partitioned into spans (MacBERT samples a span around each chosen word instead; a partition
  keeps the exact-rate sampler as is); in a packed block a span may join two documents;
- ``token``: a single token (character-level masking, the ablation of whole-word masking).

Sampling (per example): with ``n`` maskable tokens (not special tokens or padding) and
``target = mlm_probability * n``, units are visited in the order of their random keys (ties, rare with
24-bit keys, broken by index) and selected while the running token count stays within ``target``; the unit
that would cross it is selected with probability ``(target - covered) / len(unit)``. The expected number
of masked tokens is exactly ``target`` (no rounding bias, short examples included), and a unit is always
masked whole. Each selected unit is then replaced by ``[MASK]`` (``mask_replace_prob``), by random
ordinary tokens (``random_replace_prob``) or kept; ``attention_mask`` stays 1 on every real token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, get_args

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.tokenizer import block_special_ids, ordinary_token_ids

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9  # offsets the epoch so that epoch 0 does not hash to the seed's own key
_POSITION_SALT = 0x632BE5AB


def mix32(x: np.ndarray) -> np.ndarray:
    """lowbias32, a 32-bit integer finalizer with good avalanche, on ``uint32`` arrays (a new array)."""
    x = x ^ (x >> np.uint32(16))
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def key_array(keys: torch.Tensor) -> np.ndarray:
    """Keys as the ``uint32`` array :func:`uniform_np` takes (convert once, draw many streams)."""
    return (keys.cpu().numpy().astype(np.int64) & _M32).astype(np.uint32)


def example_keys(seed: int, epoch: torch.Tensor, example_id: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per example (as int64) from the seed, the epoch and the example's index."""
    ids = example_id.cpu().numpy().astype(np.int64)
    low, high = (ids & _M32).astype(np.uint32), ((ids >> 32) & _M32).astype(np.uint32)
    epoch_key = mix32(((epoch.cpu().numpy().astype(np.int64) + _GOLDEN) & _M32).astype(np.uint32))
    key = mix32(np.full(len(ids), seed & _M32, dtype=np.uint32) ^ epoch_key)
    return torch.from_numpy(mix32(mix32(key ^ low) ^ high).astype(np.int64)).to(example_id.device)


def uniform_np(keys: np.ndarray, n: int, stream: int) -> np.ndarray:
    """``(B, n)`` float32 in [0, 1) from each ``uint32`` key, the position and the stream: multiples of
    2**-24 (the hash's top 24 bits), exact in float32."""
    return uniform_at_np(keys[:, None], np.arange(n, dtype=np.uint32)[None, :], stream)


def uniform_at_np(keys: np.ndarray, positions: np.ndarray, stream: int) -> np.ndarray:
    """:func:`uniform_np` at given ``(key, position)`` pairs only (arrays that broadcast): the same values,
    for when a few positions of a batch need a draw."""
    salted = positions.astype(np.uint32) * np.uint32(4) + np.uint32((stream + _POSITION_SALT) & _M32)
    h = mix32(keys ^ mix32(salted))
    return (h >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / (1 << 24))


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
    span_keys = mix32(key_array(keys) ^ np.uint32(_NGRAM_SALT))
    draws = torch.from_numpy(uniform_np(span_keys, length, 0)).to(keys.device)
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
    """Masks whole words (units) of a padded batch: ``(masked_input_ids, labels)``, labels -100 except at
    the selected positions.

    ``input_ids`` and ``word_ids`` are ``(B, L)`` (compact word ids per example, ``-1`` on special and pad
    tokens), ``keys`` the ``(B,)`` keys of :func:`example_keys`; ``special_token_ids`` are never masked,
    whatever their word id. ``mlm_probability`` is one rate or a ``(B, 1)`` tensor of per-example rates; it
    and the other arguments are as for :class:`WholeWordMaskCollator`. ``maskable`` (word id >= 0 and not
    special, ``(B, L)``) saves computing it when the caller has it already.
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
        raise MLMAdaptError(f"data.masking.mlm_probability={mlm_probability} must be in (0, 1), e.g. 0.15")
    for key, value in (
        ("mask_replace_prob", mask_replace_prob),
        ("random_replace_prob", random_replace_prob),
    ):
        if not 0.0 <= value <= 1.0:
            raise MLMAdaptError(f"data.masking.{key}={value} must be in [0, 1]")
    if mask_replace_prob + random_replace_prob > 1.0:
        raise MLMAdaptError(
            "data.masking.mask_replace_prob + data.masking.random_replace_prob = "
            f"{mask_replace_prob + random_replace_prob}"
            " exceeds 1; lower one of them (default 0.8 / 0.1)"
        )


class WholeWordMaskCollator:
    """Pads examples and masks whole words; the ``collate_fn`` of every mlm_adapt DataLoader.

    Args:
        tokenizer: The model's tokenizer (needs a mask token).
        mlm_probability: Expected fraction of maskable tokens to predict; an example carrying a
            ``mlm_probability`` (set by a masking-rate schedule) is masked at that rate instead.
        mask_replace_prob: Fraction of selected words replaced by ``[MASK]``.
        random_replace_prob: Fraction of selected words replaced by random ordinary tokens.
        pad_to_multiple_of: Pad the batch length up to a multiple of this (tensor-core friendly); 1 for none.
        seed: Seed of the masking hash.
        scheme: Masking unit: ``whole_word`` (jieba words), ``ngram`` (spans of 1-4 words) or ``token``
            (single tokens, the character-masking ablation); see the module docstring. The batch's
            ``word_ids`` stay the jieba word ids whatever the unit.
        document_attention: Add ``document_ids`` (``-1`` on padding) and ``position_ids`` restarting at
            every document's opening ``[CLS]`` (blocks built with ``document_delimiters``), for attention
            within each document.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        mlm_probability: float = 0.15,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
        pad_to_multiple_of: int = 8,
        seed: int = 0,
        scheme: MaskingScheme = "whole_word",
        document_attention: bool = False,
    ):
        if tokenizer.mask_token_id is None:
            raise MLMAdaptError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no mask token; "
                "masked-LM adaptation needs a BERT-style tokenizer with [MASK]"
            )
        check_probabilities(mlm_probability, mask_replace_prob, random_replace_prob)
        if scheme not in get_args(MaskingScheme):
            raise MLMAdaptError(
                f"data.masking.scheme={scheme!r} is not a masking scheme; "
                f"use one of {', '.join(get_args(MaskingScheme))}"
            )
        self.mask_token_id = tokenizer.mask_token_id
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.random_token_ids = torch.tensor(ordinary_token_ids(tokenizer), dtype=torch.int64)
        self.special_token_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.int64)
        # A per-id table: one gather instead of torch.isin over the batch. Ids past the tokenizer (which no
        # embedding could look up either) are clipped onto the last entry rather than raising here.
        self.is_special = np.zeros(max(len(tokenizer), int(self.special_token_ids.max()) + 1), dtype=bool)
        self.is_special[self.special_token_ids.numpy()] = True
        self.mlm_probability = mlm_probability
        self.mask_replace_prob = mask_replace_prob
        self.random_replace_prob = random_replace_prob
        self.pad_to_multiple_of = max(1, pad_to_multiple_of)
        self.seed = seed
        self.scheme = scheme
        self.document_attention = document_attention
        self.block_start_id = block_special_ids(tokenizer)[0] if document_attention else None
        self._unkeyed_calls = 0

    def pad(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Pads ``input_ids``/``word_ids`` to a common length; ``attention_mask`` is 0 on padding only."""
        lengths = np.fromiter((len(f["input_ids"]) for f in features), dtype=np.int64, count=len(features))
        multiple = self.pad_to_multiple_of
        length = -(-int(lengths.max()) // multiple) * multiple
        # One boolean-mask assignment fills the rows in order: no per-row tensor copies.
        real = np.arange(length)[None, :] < lengths[:, None]
        input_ids = np.full((len(features), length), self.pad_token_id, dtype=np.int64)
        word_ids = np.full((len(features), length), -1, dtype=np.int64)
        input_ids[real] = np.concatenate([np.asarray(f["input_ids"]) for f in features])
        word_ids[real] = np.concatenate([np.asarray(f["word_ids"]) for f in features])
        return {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(real.astype(np.int64)),
            "word_ids": torch.from_numpy(word_ids),
        }

    def keys(self, features: Sequence[dict[str, Any]]) -> torch.Tensor:
        """Per-example masking keys; examples without an ``example_id`` get a running call counter."""
        if all("example_id" in f for f in features):
            example_id = torch.tensor([int(f["example_id"]) for f in features], dtype=torch.int64)
        else:
            start = self._unkeyed_calls
            self._unkeyed_calls += len(features)
            example_id = torch.arange(start, start + len(features), dtype=torch.int64)
        epoch = torch.tensor([int(f.get("epoch", 0)) for f in features], dtype=torch.int64)
        return example_keys(self.seed, epoch, example_id)

    def documents(
        self, input_ids: torch.Tensor, word_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """``document_ids`` and restarting ``position_ids`` of packed blocks (before masking: a ``[CLS]``
        is never masked, and only a special token has word id -1)."""
        starts = (input_ids == self.block_start_id) & (word_ids < 0)
        document_ids = torch.where(attention_mask.bool(), starts.long().cumsum(1) - 1, -1)
        positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        start_of = torch.where(starts, positions, 0).cummax(1).values
        position_ids = torch.where(document_ids >= 0, positions - start_of, 0)
        return {"document_ids": document_ids, "position_ids": position_ids}

    def rates(self, features: Sequence[dict[str, Any]]) -> float | torch.Tensor:
        """The masking rate: ``mlm_probability``, or a ``(B, 1)`` tensor of the examples' own
        ``mlm_probability``."""
        if not any("mlm_probability" in f for f in features):
            return self.mlm_probability
        rates = [float(f.get("mlm_probability", self.mlm_probability)) for f in features]
        return torch.tensor(rates, dtype=torch.float32)[:, None]

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Collates examples with ``input_ids``, ``word_ids`` and optionally ``example_id``, ``epoch``,
        ``mlm_probability``; adds each row's ``maskable_tokens`` (the realized rate's denominator) and masking
        ``example_keys`` (which also decide general-text replay, :mod:`mlm_adapt.data.replay`)."""
        batch = self.pad(features)
        keys = self.keys(features)
        special = np.take(self.is_special, batch["input_ids"].numpy(), mode="clip")
        maskable = (batch["word_ids"] >= 0) & ~torch.from_numpy(special)
        batch["maskable_tokens"] = maskable.sum(1)
        batch["example_keys"] = keys
        if self.document_attention:
            batch.update(self.documents(batch["input_ids"], batch["word_ids"], batch["attention_mask"]))
        batch["input_ids"], batch["labels"] = whole_word_mask(
            batch["input_ids"],
            masking_units(batch["word_ids"], keys, self.scheme),
            keys,
            mask_token_id=self.mask_token_id,
            random_token_ids=self.random_token_ids,
            special_token_ids=self.special_token_ids,
            mlm_probability=self.rates(features),
            mask_replace_prob=self.mask_replace_prob,
            random_replace_prob=self.random_replace_prob,
            maskable=maskable,
        )
        return batch
