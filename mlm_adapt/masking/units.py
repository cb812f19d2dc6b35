"""Masking units: which tokens are masked together, built from word ids before whole-word masking.

:func:`~mlm_adapt.masking.sampler.whole_word_mask` masks whole *units*, where a unit is whatever the word-id
tensor groups. Changing the unit changes the masking scheme without touching the sampler, so every scheme
keeps its properties (expected rate exactly ``mlm_probability``, reproducible counter-hash randomness):

- ``whole_word``: a unit is a jieba word (the word ids as they are);
- ``ngram``: a unit is a span of 1-4 consecutive words, lengths drawn at 40/30/20/10% (MacBERT-style
  n-gram masking). Each example's words are partitioned into such spans, so a span is a union of whole words.
  MacBERT samples a span around each chosen word instead; a partition keeps the exact-rate sampler as is. In
  a packed block a span may join the last words of one document and the first of the next;
- ``token``: a unit is a single token (character-level masking, the ablation of whole-word masking).
"""

from __future__ import annotations

from typing import Literal

import torch

from mlm_adapt.masking.hashing import derive_keys, uniform

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
    """Groups consecutive words into spans of ``1..len(probabilities)`` words.

    Args:
        word_ids: ``(B, L)`` compact word ids per example (``0..n-1`` along the row), ``-1`` on specials/pad.
        keys: ``(B,)`` per-example random keys, as for :func:`~mlm_adapt.masking.sampler.whole_word_mask`.
        probabilities: Probability of a span of 1, 2, ... words.

    Returns:
        ``(B, L)`` compact span ids, ``-1`` where ``word_ids`` is ``-1``.
    """
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
    """Unit ids to hand to :func:`~mlm_adapt.masking.sampler.whole_word_mask` for a masking scheme."""
    if scheme == "whole_word":
        return word_ids
    if scheme == "ngram":
        return ngram_units(word_ids, keys)
    if scheme == "token":
        return token_units(word_ids)
    raise ValueError(f"unknown masking scheme {scheme!r}")
