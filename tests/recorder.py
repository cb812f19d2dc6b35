"""Test-only callback: records which examples every rank trains on, and can SIGKILL its own process.

Passed to the CLI as ``--trainer.callbacks+=tests.recorder.BatchRecorder`` (run_cli puts the repo on
PYTHONPATH). Example identity is recovered from the batch itself -- the unmasked tokens are ``labels``
where a position was selected, ``input_ids`` elsewhere -- and looked up in the datamodule's train blocks,
so what is checked is what the model actually received, not what the sampler was expected to yield.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch


def original_rows(batch: dict[str, torch.Tensor]) -> list[tuple[int, ...]]:
    """The unmasked token ids of every example in a collated batch, padding removed."""
    original = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    return [tuple(row[:n].tolist()) for row, n in zip(original, lengths, strict=True)]


def batch_digest(batch: dict[str, torch.Tensor]) -> str:
    """A digest of the masked inputs and labels (same examples *and* same masks give the same digest)."""
    h = hashlib.sha1()
    for key in ("input_ids", "labels", "attention_mask"):
        h.update(batch[key].cpu().numpy().tobytes())
    return h.hexdigest()


class BatchRecorder(L.Callback):
    """Appends one JSON line per training batch to ``out_dir/rank{R}.jsonl``.

    Args:
        out_dir: Where to write.
        kill_at_step: Send ``kill_signal`` to this process at the first batch start with
            ``global_step == kill_at_step`` (after the checkpoints of that step were written, before the batch
            is recorded).
        kill_signal: ``SIGKILL`` (a crash) or e.g. ``SIGUSR1`` (SLURM's pre-timeout warning).
        kill_rank: Only this global rank kills itself (default: every rank).
        pause_s: Sleep this long after every batch (a job slow enough to be signalled mid-run).

    Every batch's training loss goes to ``out_dir/loss{R}.jsonl`` (``step``, ``loss``) at its end.
    """

    def __init__(
        self,
        out_dir: str,
        kill_at_step: int | None = None,
        kill_signal: str = "SIGKILL",
        kill_rank: int | None = None,
        pause_s: float = 0.0,
    ):
        self.out_dir = Path(out_dir)
        self.kill_at_step = kill_at_step
        self.kill_signal = kill_signal
        self.kill_rank = kill_rank
        self.pause_s = pause_s
        self.index: dict[tuple[int, ...], int] | None = None
        self._step = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dataset = getattr(trainer.datamodule, "train_dataset", None)
        if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):  # map-style: index by content
            rows = [tuple(ids) for ids in dataset["input_ids"]]
            self.index = {row: i for i, row in enumerate(rows)}
            assert len(self.index) == len(rows), "train blocks are not unique; cannot identify examples"
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step = trainer.global_step
        killing = self.kill_rank is None or self.kill_rank == trainer.global_rank
        if self.kill_at_step is not None and trainer.global_step == self.kill_at_step and killing:
            os.kill(os.getpid(), getattr(signal, self.kill_signal))
        rows = original_rows(batch)
        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "batch_idx": batch_idx,
            "digest": batch_digest(batch),
            "rows": [hashlib.sha1(repr(r).encode()).hexdigest()[:16] for r in rows],
            "lengths": [len(r) for r in rows],
        }
        if self.index is not None:  # -1: a replayed general block (data.replay.files), not a training block
            record["ids"] = [self.index.get(r, -1) for r in rows]
        if "replay_rate" in batch:
            record["replay_rate"] = float(batch["replay_rate"])
        with open(self.out_dir / f"rank{trainer.global_rank}.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        record = {"step": self._step, "loss": float(loss)}
        with open(self.out_dir / f"loss{trainer.global_rank}.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.pause_s:
            time.sleep(self.pause_s)


def read_records(out_dir: Path, rank: int = 0, kind: str = "rank") -> list[dict]:
    """The recorded batches of one rank, in order (``kind="loss"``: their losses)."""
    path = Path(out_dir) / f"{kind}{rank}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def recorded_fit_args(root: Path, steps: int, checkpoint_every: int) -> list[str]:
    """Fit arguments for a run that records every batch into ``root/rec`` and checkpoints into
    ``root/ckpt`` every ``checkpoint_every`` steps (with ``last.ckpt``); epochs of 6 batches, so that a run
    resumed mid-epoch 0 crosses into epoch 1 (reshuffle, new masks, a validation in between)."""
    return [
        f"--trainer.max_steps={steps}",
        "--trainer.limit_train_batches=6",
        "--trainer.callbacks+=ModelCheckpoint",
        f"--trainer.callbacks.dirpath={root / 'ckpt'}",
        f"--trainer.callbacks.every_n_train_steps={checkpoint_every}",
        "--trainer.callbacks.save_last=true",
        "--trainer.callbacks+=tests.recorder.BatchRecorder",
        f"--trainer.callbacks.out_dir={root / 'rec'}",
    ]


def assert_kill_and_resume_reproduces(fit: Callable[..., Any], root: Path, steps: int, kill_at: int) -> None:
    """Runs ``fit(run_dir, *extra)`` straight (``root/straight``), then killed by SIGKILL after ``kill_at``
    steps and resumed with ``--ckpt_path last`` (``root/killed``); asserts that the resumed run saw the same
    steps, examples and masks as the straight one."""
    straight, killed = root / "straight", root / "killed"
    result = fit(straight)
    assert result.returncode == 0, result.stderr[-3000:]
    result = fit(killed, f"--trainer.callbacks.kill_at_step={kill_at}")
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    assert (killed / "ckpt" / "last.ckpt").is_file()
    first_half = read_records(killed / "rec")
    assert [r["step"] for r in first_half] == list(range(kill_at))
    (killed / "rec" / "rank0.jsonl").rename(killed / "rec" / "first_half.jsonl")
    result = fit(killed, "--ckpt_path=last")
    assert result.returncode == 0, result.stderr[-3000:]

    expected = read_records(straight / "rec")
    assert [r["step"] for r in expected] == list(range(steps))
    assert {r["epoch"] for r in expected} == {0, 1}
    key = ("step", "epoch", "batch_idx", "ids", "digest", "replay_rate")  # digest: same examples and masks
    resumed = first_half + read_records(killed / "rec")
    assert [{k: r.get(k) for k in key} for r in resumed] == [{k: r.get(k) for k in key} for r in expected]


class NumpyState(L.Callback):
    """Keeps numpy values in its checkpoint state, as callbacks do (a best score as ``np.float64``), and
    writes what it loaded back to ``out_file`` (JSON), so a test can see that a resume restored them."""

    def __init__(self, out_file: str):
        self.out_file = Path(out_file)
        self.best = np.float64(0.0)
        self.history = np.zeros(0, dtype=np.float32)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.best = np.float64(trainer.global_step)
        self.history = np.append(self.history, np.float32(trainer.global_step))

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "history": self.history, "steps": np.int64(len(self.history))}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best, self.history = state_dict["best"], state_dict["history"]
        loaded = {
            key: [type(value).__name__, np.asarray(value).tolist()] for key, value in state_dict.items()
        }
        self.out_file.write_text(json.dumps(loaded), encoding="utf-8")
