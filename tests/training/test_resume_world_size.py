"""A run resumed on another number of ranks continues the uninterrupted run's global example order: every
rank draws the epoch's order in turn, and the resume starts at the example the checkpoint's ranks had
reached, in global batches of the new size (one line says so)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import run_cli, tiny_fit_args
from recorder import read_records

BATCH = 4  # per rank
STOP_AT = 3  # SIGUSR1 at this step's batch: the checkpoint is at step 4, in epoch 0


def _args(model_dir: Path, corpus: Path, root: Path, cache: Path, ranks: int, steps: int, *extra: str):
    return tiny_fit_args(
        model_dir,
        corpus,
        root,
        f"--trainer.max_steps={steps}",
        f"--data.batch_size={BATCH}",
        f"--trainer.devices={ranks}",
        *(["--trainer.strategy=ddp"] if ranks > 1 else []),
        "--trainer.limit_val_batches=0",
        "--export.checkpoint=none",
        "--trainer.callbacks+=ModelCheckpoint",
        f"--trainer.callbacks.dirpath={root / 'ckpt'}",
        "--trainer.callbacks.save_last=true",
        "--trainer.callbacks+=tests.recorder.BatchRecorder",
        f"--trainer.callbacks.out_dir={root / 'rec'}",
        f"--data.cache_dir={cache}",
        *extra,
    )


def global_order(rec: Path, ranks: int, before_step: int | None = None, from_step: int = 0) -> list:
    """The (epoch, example) sequence all ranks trained on, in the epoch's global order: at every step,
    position ``j`` of rank ``r``'s batch is position ``j * ranks + r`` of the step's slice."""
    per_rank = [read_records(rec, rank) for rank in range(ranks)]
    order = []
    for records in zip(*per_rank, strict=True):
        step = records[0]["step"]
        if step < from_step or (before_step is not None and step >= before_step):
            continue
        for j in range(BATCH):
            order += [(r["epoch"], r["ids"][j]) for r in records]
    return order


@pytest.mark.parametrize(
    ("before", "after"), [(2, 1), pytest.param(1, 2, marks=pytest.mark.slow)], ids=["2to1", "1to2"]
)
def test_a_resume_on_another_number_of_ranks_continues_the_global_example_order(
    tiny_model_dir, review_texts, tmp_path, before, after
):
    corpus = tmp_path / "reviews.txt"
    corpus.write_text("\n".join(review_texts) + "\n", encoding="utf-8")
    cache = tmp_path / "hf_cache"
    resumed_steps = 6
    # Long enough to hold every example the interrupted run trains on, before and after the resume.
    straight_steps = math.ceil(((STOP_AT + 1) * before + resumed_steps * after) / before)
    straight = tmp_path / "straight"
    done = run_cli(
        "fit", *_args(tiny_model_dir, corpus, straight, cache, before, straight_steps), timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]

    root = tmp_path / "stopped"
    stop = [f"--trainer.callbacks.kill_at_step={STOP_AT}", "--trainer.callbacks.kill_signal=SIGUSR1"]
    first = run_cli("fit", *_args(tiny_model_dir, corpus, root, cache, before, 20, *stop), timeout=600)
    assert first.returncode != 0
    resumed_at = int(torch.load(root / "ckpt" / "last.ckpt", weights_only=True)["global_step"])
    assert resumed_at == STOP_AT + 1
    trained_before = global_order(root / "rec", before, before_step=resumed_at)
    for path in (root / "rec").iterdir():
        path.rename(path.with_suffix(".first"))
    steps = resumed_at + resumed_steps
    second = run_cli(
        "fit", *_args(tiny_model_dir, corpus, root, cache, after, steps, "--ckpt_path=last"), timeout=600
    )
    assert second.returncode == 0, second.stderr[-3000:]
    output = second.stdout + second.stderr
    line = f"mlm_adapt: resuming on {after} rank(s) instead of the checkpoint's {before}: a global batch is "
    assert line + f"{BATCH * after} examples instead of {BATCH * before}" in output
    assert f"the epoch's example order continues at example {resumed_at * BATCH * before}" in output

    trained_after = global_order(root / "rec", after)
    assert len(trained_after) == resumed_steps * BATCH * after
    expected = global_order(straight / "rec", before)
    got = trained_before + trained_after
    assert {epoch for epoch, _ in got} == {0}  # within the epoch the checkpoint was written in
    assert got == expected[: len(got)]


def record(**state):
    """A checkpoint's entries with ``state`` as its resume record."""
    return {"callbacks": {"ResumeMatch": state}}


@pytest.mark.parametrize("saved", [1, 4])
def test_a_streamed_corpus_is_not_resumed_on_another_number_of_ranks(saved):
    from mlm_adapt.errors import MLMAdaptError
    from mlm_adapt.training.resume import WORLD_KEY, ResumeMatch, saved_record

    match = ResumeMatch()
    match.world_size, match.streaming = 2, True
    with pytest.raises(MLMAdaptError, match=rf"written by {saved} ranks .* resume on {saved} ranks"):
        match.check(record(**{WORLD_KEY: saved}))
    match.check(record(**{WORLD_KEY: 2}))  # the same number: resumed
    match.check({})  # a run without ResumeMatch recorded no number: taken as the same
    assert (
        saved_record({})[WORLD_KEY] is None and saved_record(record(**{WORLD_KEY: saved}))[WORLD_KEY] == saved
    )
