"""The DataModule's collators: fixed-rate validation masks and (possibly scheduled) training masks."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.masking import MaskingScheme, WholeWordMaskCollator
from mlm_adapt.masking.sampler import check_probabilities
from mlm_adapt.masking.schedule import MaskingSchedule, parse_schedule


def check_masking(hparams: Any) -> MaskingSchedule:
    """Validates ``MLMDataModule``'s masking (and document attention) settings; returns the schedule."""
    schedule = parse_schedule(hparams["mlm_probability"])
    eval_rate = hparams.get("eval_mlm_probability", 0.15)
    if isinstance(eval_rate, bool) or not isinstance(eval_rate, int | float) or not 0.0 < eval_rate < 1.0:
        raise MLMAdaptError(f"data.eval_mlm_probability={eval_rate!r} must be a rate in (0, 1), e.g. 0.15")
    check_probabilities(schedule.initial_rate, hparams["mask_replace_prob"], hparams["random_replace_prob"])
    if hparams.get("document_attention") and hparams.get("streaming"):
        raise MLMAdaptError(
            "data.document_attention is not available with data.streaming; set one of them to false"
        )
    if not schedule.constant and hparams.get("streaming"):
        # A stream has no loader positions to derive steps from (workers split files, not batches).
        raise MLMAdaptError(
            "data.mlm_probability: a masking-rate schedule needs a map-style corpus; "
            "set data.streaming: false or use one rate"
        )
    return schedule


def make_collator(
    tokenizer: PreTrainedTokenizerBase, hparams: Any, masking: MaskingScheme, rate: float
) -> WholeWordMaskCollator:
    """A collator with the DataModule's replacement probabilities, padding and seed."""
    return WholeWordMaskCollator(
        tokenizer,
        mlm_probability=rate,
        mask_replace_prob=hparams["mask_replace_prob"],
        random_replace_prob=hparams["random_replace_prob"],
        pad_to_multiple_of=hparams["pad_to_multiple_of"],
        seed=hparams["seed"],
        masking=masking,
        # Unpacked blocks hold one document each: nothing to separate.
        document_attention=bool(hparams.get("document_attention")) and hparams["packing"],
    )


def train_collator(
    tokenizer: PreTrainedTokenizerBase, hparams: Any, eval_collator: WholeWordMaskCollator
) -> WholeWordMaskCollator:
    """The training collator: ``data.masking`` units at the schedule's rate (the sampler attaches the rate of
    each batch's step when the schedule is not constant); reuses ``eval_collator`` when it is the same."""
    rate = parse_schedule(hparams["mlm_probability"]).initial_rate
    if hparams["masking"] == "whole_word" and rate == eval_collator.mlm_probability:
        return eval_collator
    return make_collator(tokenizer, hparams, hparams["masking"], rate)
