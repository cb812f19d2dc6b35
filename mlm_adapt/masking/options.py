"""The ``data.masking`` options: what training and validation mask, with their checks."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.masking.collator import MaskingScheme, check_probabilities
from mlm_adapt.masking.schedule import RateSchedule, RateSpec, parse_schedule


@dataclass(kw_only=True, frozen=True)
class MaskingOptions:
    """What is masked (``data.masking``; docs/recipe.md). The names of the rates are Hugging Face's.

    Args:
        mlm_probability: Expected fraction of maskable tokens to predict in training: a rate, or
            ``[fraction_of_training, rate]`` points, linear in between over the optimizer steps (e.g.
            ``[[0.0, 0.3], [1.0, 0.15]]``; docs/recipe.md). Logged as ``train/mlm_probability``.
        eval_mlm_probability: The fixed rate of validation and test masks (comparable across the run).
        mask_replace_prob: Fraction of selected words replaced by ``[MASK]``.
        random_replace_prob: Fraction of selected words replaced by random tokens (the rest stay unchanged).
        scheme: Training masking unit: ``whole_word`` (jieba words), ``ngram`` (MacBERT-style spans of 1-4
            words at 40/30/20/10%) or ``token`` (character masking, an ablation). Validation and test
            always use whole-word masks, so metrics compare across schemes.
    """

    mlm_probability: RateSpec = 0.15
    eval_mlm_probability: float = 0.15
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1
    scheme: MaskingScheme = "whole_word"

    @cached_property
    def schedule(self) -> RateSchedule:
        """The training rate over the run (constant for one rate)."""
        return parse_schedule(self.mlm_probability, "data.masking.mlm_probability")

    def check(self) -> MaskingOptions:
        """Refuses, in one line naming the key, a rate or probability out of range; returns the options."""
        eval_rate = self.eval_mlm_probability
        if isinstance(eval_rate, bool) or not isinstance(eval_rate, int | float) or not 0.0 < eval_rate < 1.0:
            raise MLMAdaptError(
                f"data.masking.eval_mlm_probability={eval_rate!r} must be a rate in (0, 1), e.g. 0.15"
            )
        check_probabilities(self.schedule.initial_rate, self.mask_replace_prob, self.random_replace_prob)
        return self
