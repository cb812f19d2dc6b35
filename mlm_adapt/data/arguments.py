"""The DataModule's argument checks: each bad value is one line naming its key, before any data is read."""

from __future__ import annotations

from typing import Any

from mlm_adapt.errors import MLMAdaptError


def check_arguments(hp: Any) -> None:
    """Refuses values torch or datasets would reject only after preprocessing (or never)."""
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
    if not 0.0 <= hp.mix_probability < 1.0:
        raise MLMAdaptError(f"data.mix_probability={hp.mix_probability} must be in [0, 1), e.g. 0.2")
    if hp.mix_probability > 0 and not hp.mix_files:
        raise MLMAdaptError("data.mix_probability > 0 needs data.mix_files (general-domain text files)")
    if hp.prepared_dir and hp.streaming:
        raise MLMAdaptError("data.prepared_dir: prepared blocks are not streamed; set data.streaming false")
    if hp.mix_probability > 0 and hp.streaming:
        raise MLMAdaptError(
            "data.mix_files: mixing is not available with data.streaming; mix the files beforehand"
        )
