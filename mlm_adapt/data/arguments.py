"""The DataModule's argument checks: each bad value is one line naming its key, before any data is read."""

from __future__ import annotations

import math
from typing import Any

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.masking.schedule import MaskingSchedule


def check_arguments(hp: Any, mix: MaskingSchedule) -> None:
    """Refuses values torch or datasets would reject only after preprocessing (or never); ``mix`` is the
    parsed ``data.mix_probability``."""
    if not hp.train_files and not hp.dataset_name and not hp.prepared_dir:
        raise MLMAdaptError("data.train_files is empty; give text files or globs (or data.dataset_name)")
    if not 0.0 <= hp.validation_split < 1.0:
        raise MLMAdaptError(f"data.validation_split={hp.validation_split} must be in [0, 1), e.g. 0.05")
    if hp.max_seq_length < 8:
        raise MLMAdaptError(
            # In a fit config the value comes from model.max_seq_length (linked here): name that key.
            f"model.max_seq_length={hp.max_seq_length} is too short (data.max_seq_length when the "
            "datamodule is used alone); use at least 8 (e.g. 512)"
        )
    sizes = {
        "batch_size": 1,
        "eval_batch_size": 1,
        "num_workers": 0,
        "preprocessing_num_workers": 1,
        "pad_to_multiple_of": 1,
        "shuffle_buffer_size": 0,  # 0 and 1: no shuffle buffer
    }
    for key, least in sizes.items():  # torch and datasets would refuse them only after preprocessing
        if hp[key] is not None and hp[key] < least:
            raise MLMAdaptError(f"data.{key}={hp[key]} must be at least {least}")
    if max(rate for _, rate in mix.points) > 0 and not hp.mix_files:
        raise MLMAdaptError("data.mix_probability > 0 needs data.mix_files (general-domain text files)")
    if hp.prepared_dir and hp.streaming:
        raise MLMAdaptError("data.prepared_dir: prepared blocks are not streamed; set data.streaming false")
    if hp.mix_files and hp.streaming:
        raise MLMAdaptError(
            "data.mix_files: replay is not available with data.streaming; mix the files beforehand"
        )


def check_budget(hp: Any, mix: MaskingSchedule, set_names: list[str]) -> None:
    """Refuses a ``data.forgetting_budget`` the run could not hold: no general text, no general set."""
    budget = hp.get("forgetting_budget")
    if not 0.0 < hp.max_mix_rate < 1.0:
        raise MLMAdaptError(f"data.max_mix_rate={hp.max_mix_rate} must be in (0, 1), e.g. 0.5")
    for key in ("forgetting_check_interval", "forgetting_check_batches"):
        if hp[key] is not None and hp[key] < 1:
            raise MLMAdaptError(f"data.{key}={hp[key]} must be at least 1")
    if budget is None:
        return
    if not budget > 0 or math.isinf(budget):
        raise MLMAdaptError(f"data.forgetting_budget={budget} must be > 0, e.g. 0.2 (+20% perplexity)")
    if not hp.mix_files:
        raise MLMAdaptError(
            "data.forgetting_budget needs general text to replay: set data.mix_files (general-domain files)"
        )
    if len(set_names) < 2:
        raise MLMAdaptError(
            "data.forgetting_budget needs a general validation set to measure forgetting on: give "
            "data.validation_files as a mapping, e.g. {domain: null, general: [general_val.txt]}"
        )
    if not mix.constant:
        raise MLMAdaptError(
            "data.mix_probability: with data.forgetting_budget it is the starting rate, one number (e.g. 0.1)"
        )
    if mix.initial_rate > hp.max_mix_rate:
        raise MLMAdaptError(
            f"data.mix_probability={mix.initial_rate} exceeds data.max_mix_rate={hp.max_mix_rate}; "
            "lower the one or raise the other"
        )
