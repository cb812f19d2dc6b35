"""Streaming corpora: uneven shards under 2-process DDP, worker sharding, resumable stream state."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_cli, tiny_fit_args
from recorder import original_rows, read_records

from mlm_adapt.data import MLMDataModule
from mlm_adapt.data.streaming import is_held_out
from mlm_adapt.errors import MLMAdaptError


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.slow
def test_streaming_ddp_with_uneven_shards_finishes_on_both_ranks(tiny_model_dir, review_texts, tmp_path):
    # Two files -> one per rank: rank 0 streams 300 reviews, rank 1 only 6 (a few batches per pass).
    big = _write(tmp_path / "corpus" / "a_big.txt", review_texts[:300])
    _write(tmp_path / "corpus" / "b_small.txt", review_texts[300:306])
    val = _write(tmp_path / "val" / "val.txt", review_texts[550:600])
    rec, steps = tmp_path / "rec", 6
    args = tiny_fit_args(
        tiny_model_dir,
        big,
        tmp_path,
        f"--data.train_files=[{tmp_path / 'corpus' / '*.txt'}]",
        f"--data.validation_files=[{val}]",
        # Line-by-line blocks stay the same across passes (packing re-packs each reshuffled pass differently),
        # so a restarted shard shows up as repeated blocks.
        "--data.streaming.enabled=true",
        "--data.streaming.shuffle_buffer_size=16",
        "--data.blocks.packing=false",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        f"--trainer.max_steps={steps}",
        "--trainer.val_check_interval=3",
        "--trainer.callbacks+=tests.recorder.BatchRecorder",
        f"--trainer.callbacks.out_dir={rec}",
    )
    result = run_cli("fit", *args, timeout=240)  # a hang at an epoch end would time out here
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [read_records(rec, r) for r in (0, 1)]
    assert [len(r) for r in ranks] == [steps, steps]
    rows = [[h for r in recs for h in r["rows"]] for recs in ranks]
    big_rank, small_rank = sorted(rows, key=lambda r: len(set(r)), reverse=True)  # which file went where
    assert len(set(big_rank)) == len(big_rank)  # the big shard: still in its first pass
    assert len(set(small_rank)) < len(small_rank) // 2  # the small shard was restarted (new passes)
    assert not set(rows[0]) & set(rows[1]), "ranks streamed overlapping examples"
    assert len(list(tmp_path.glob("lightning_logs/version_0/checkpoints/*.ckpt"))) == 1


@pytest.fixture
def two_file_datamodule(tiny_model_dir, review_texts, tmp_path):
    files = [_write(tmp_path / f"part{i}.txt", review_texts[i * 40 : (i + 1) * 40]) for i in range(2)]
    val = _write(tmp_path / "val.txt", review_texts[500:520])

    def make(shuffle_buffer_size: int = 10_000, **kwargs) -> MLMDataModule:
        dm = MLMDataModule(
            train_files=[str(f) for f in files],
            validation_files=[str(val)],
            tokenizer_name_or_path=str(tiny_model_dir),
            max_seq_length=32,
            batch_size=4,
            **kwargs,
            streaming={"enabled": True, "shuffle_buffer_size": shuffle_buffer_size},
        )
        dm.setup("fit")
        return dm

    return make


def test_streaming_workers_read_disjoint_files(two_file_datamodule):
    dm = two_file_datamodule(num_workers=2, shuffle_buffer_size=0, blocks={"packing": False})
    loader = dm.train_dataloader()
    one_pass = [tuple(row["input_ids"]) for row in loader.dataset.blocks]  # the rank's blocks, read once
    assert len(set(one_pass)) == len(one_pass)
    rows = []
    for batch in loader:  # workers alternate batches; unsharded workers would both yield the first blocks
        rows += original_rows(batch)
        if len(rows) >= len(one_pass) // 2:  # before any worker can have started a second pass
            break
    assert len(set(rows)) == len(rows), "two workers streamed the same blocks"
    assert set(rows) <= set(one_pass)


def test_streaming_state_dict_resumes_at_the_next_batch(two_file_datamodule):
    dm = two_file_datamodule(num_workers=0, shuffle_buffer_size=0)
    loader = dm.train_dataloader()
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    expected = [original_rows(next(it)) for _ in range(12)]  # crosses into the second pass

    fresh = two_file_datamodule(num_workers=0, shuffle_buffer_size=0).train_dataloader()
    fresh.load_state_dict(state)
    it = iter(fresh)
    assert [original_rows(next(it)) for _ in range(12)] == expected


def test_streaming_requires_max_steps(two_file_datamodule):
    dm = two_file_datamodule(num_workers=0)
    dm.trainer = type("T", (), {"max_steps": -1, "world_size": 1, "global_rank": 0})()
    with pytest.raises(MLMAdaptError, match="trainer.max_steps"):
        dm.train_dataloader()


def test_held_out_split_is_deterministic_and_near_the_fraction(review_texts):
    flags = [is_held_out(t, 0.2, seed=1) for t in review_texts]
    assert flags == [is_held_out(t, 0.2, seed=1) for t in review_texts]
    assert 0.12 < sum(flags) / len(flags) < 0.28


class PidRecordingSegmenter:
    """Characters as words; every build appends its process id to ``log`` (a user class-path segmenter)."""

    def __init__(self, log: str) -> None:
        self.log = log
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"{os.getpid()}\n")

    def segment(self, texts: list[str]) -> list[list[str]]:
        return [list(text) for text in texts]


@pytest.mark.slow
def test_streaming_workers_build_a_class_path_segmenter_from_its_config_value(two_file_datamodule, tmp_path):
    """The data module records the mapping as given; a DataLoader worker that gets the data pickled (spawn,
    forkserver: the default start methods of macOS and Python 3.14) builds its own segmenter from that
    value, and no built segmenter is pickled."""
    log = tmp_path / "builds.txt"
    spec = {"class_path": f"{__name__}.PidRecordingSegmenter", "init_args": {"log": str(log)}}
    dm = two_file_datamodule(num_workers=2, shuffle_buffer_size=0, segmentation={"segmenter": spec})
    assert dm.hparams.segmentation["segmenter"] == spec
    assert log.read_text(encoding="utf-8").split() == [str(os.getpid())]  # built once, by the data module
    loader = dm.train_dataloader()
    loader.multiprocessing_context = "spawn"
    # Two batches: an iterable dataset's batches come from the workers in turn, so both have segmented.
    first, _ = (batch for _, batch in zip(range(2), loader, strict=False))
    assert first["input_ids"].shape[0] == 4
    builds = log.read_text(encoding="utf-8").split()[1:]
    assert len(builds) == 2 and len(set(builds)) == 2 and str(os.getpid()) not in builds, builds
