"""DataModule arguments torch would reject only after preprocessing are refused up front."""

from __future__ import annotations

import pytest
from conftest import make_datamodule

from mlm_adapt.errors import MLMAdaptError


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("batch_size", 0),
        ("batch_size", -1),
        ("eval_batch_size", 0),  # was silently replaced by batch_size
        ("num_workers", -1),
        ("preprocessing_num_workers", 0),
    ],
)
def test_bad_loader_sizes_are_refused_at_construction(key, value, tiny_model_dir, corpus_file, tmp_path):
    with pytest.raises(MLMAdaptError, match=rf"data\.{key}={value} "):
        make_datamodule(tiny_model_dir, corpus_file, tmp_path, **{key: value})


def test_eval_batch_size_is_used_when_given(tiny_model_dir, corpus_file, tmp_path):
    datamodule = make_datamodule(tiny_model_dir, corpus_file, tmp_path, batch_size=8, eval_batch_size=3)
    datamodule.setup("fit")
    assert datamodule.val_dataloader().batch_size == 3
