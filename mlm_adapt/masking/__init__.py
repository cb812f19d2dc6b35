"""Masking: counter-hash randomness, units (word, n-gram, token), the exact-rate sampler, the collator."""

from mlm_adapt.masking.collator import MaskingScheme, WholeWordMaskCollator

__all__ = ["MaskingScheme", "WholeWordMaskCollator"]
