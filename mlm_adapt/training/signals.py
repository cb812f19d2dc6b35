"""SIGTERM and the requeue signal during ``fit``: a checkpoint at the next optimizer step, then a known exit.

Lightning turns SIGTERM into a flag (``trainer.received_sigterm``) and then a ``SIGTERMException``, but it
saves nothing, stops mid-accumulation, and that exception is a ``SystemExit`` with status 0 (a requeue
script sees success). :class:`StopOnSignal` holds the flag back to the next optimizer step, writes
``last.ckpt`` there through the strategy (old or new, never partial; ``fit --ckpt_path last`` continues
exactly), and the CLI exits with ``128 + signal`` (143 for SIGTERM).

The requeue signal (SLURM's ``--signal=USR1@90``) is handled the same way, and rank 0 then runs ``scontrol
requeue`` where Lightning's SLURM auto-requeue is on. Lightning's own handlers save inside the handler,
wherever each rank is (mid-step: the requeued job trained on other states than the one it replaced), and
broadcast from it, which can pair with any collective of another rank; here every rank agrees at a step
boundary (one ``all_reduce``), then saves together.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

# The stop state and its handlers outside training live with the stop exceptions (the CLI installs them
# before it imports this module); re-exported here, beside the callback that takes them over.
from mlm_adapt.errors import (  # noqa: F401
    STOP,
    Stopped,
    StopState,
    install_stop_handlers,
    record_stop,
    stop_now,
)


def requeue_signal(trainer: L.Trainer | None = None) -> int:
    """The signal a cluster sends ahead of a requeue: the SLURM environment's, else SIGUSR1."""
    environment = getattr(getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
    return int(getattr(environment, "requeue_signal", None) or signal.SIGUSR1)


def lightning_requeues(trainer: L.Trainer) -> bool:
    """Whether Lightning's SLURM auto-requeue handles the requeue signal in this run."""
    environment = trainer._accelerator_connector.cluster_environment
    return isinstance(environment, SLURMEnvironment) and environment.auto_requeue


def checkpoint_path(trainer: L.Trainer) -> Path:
    """Where the stop checkpoint goes: the run's ``last.ckpt`` (what ``--ckpt_path last`` resumes).

    The ``ModelCheckpoint`` that owns that name is told it wrote it, and the checkpoint carries that:
    otherwise the resumed run finds a ``last.ckpt`` it did not write and saves ``last-v1.ckpt`` beside it,
    leaving ``last.ckpt`` (what ``export`` and the next resume read) at the stop step."""
    callbacks = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)]
    callback = next((cb for cb in callbacks if cb.save_last and cb.dirpath), None) or next(
        (cb for cb in callbacks if cb.dirpath), None
    )
    if callback is None:
        return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    names = {"epoch": torch.tensor(trainer.current_epoch), "step": torch.tensor(trainer.global_step)}
    path = callback.format_checkpoint_name(names, callback.CHECKPOINT_NAME_LAST)
    if callback.save_last:
        callback.last_model_path = path
    return Path(path)


class StopOnSignal(L.Callback):
    """On SIGTERM (or the requeue signal) during ``fit``: ``last.ckpt`` at the next optimizer step, then stop
    (the CLI exits with ``128 + signal``, reading :data:`STOP`); ``--ckpt_path last`` continues there."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self._step_at_batch_start = 0
        # Lightning calls fit's stage TRAINING from the start, data preparation included: a stop there
        # stopped no step, so the line must not name one.
        self._fit_started = False

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_started = True  # prepare_data and setup (the corpus' preprocessing) are behind

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Before Lightning registers its own SIGTERM handler, which then calls this one too.
        if stage != "fit" or threading.current_thread() is not threading.main_thread():
            return
        # Lightning registers its requeue handler only where none is set: with this one it never does.
        for signum in (signal.SIGTERM, requeue_signal(trainer)):
            self._previous[signum] = signal.signal(signum, record_stop)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning has now composed its SIGTERM handler with this one; its part broadcasts from inside the
        # handler (see the module docstring). The flag it sets is set here at the step boundary instead.
        if threading.current_thread() is threading.main_thread() and self._previous:
            signal.signal(signal.SIGTERM, record_stop)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # Ctrl-C (or a signal that raised) while training or validating inside fit: the step it stopped at.
        in_steps = self._fit_started and trainer.state.stage in (
            RunningStage.TRAINING,
            RunningStage.VALIDATING,
        )
        if STOP.signum is not None and STOP.checkpoint is None and in_steps:
            STOP.step = trainer.global_step

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step_at_batch_start = trainer.global_step

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if STOP.signum is None and trainer.received_sigterm:  # e.g. a rank Lightning told by broadcast
            STOP.signum = signal.SIGTERM
        stepped = trainer.global_step > self._step_at_batch_start
        requested = STOP.signum is not None
        if trainer.world_size > 1 and stepped:  # every rank saves and stops at the same step
            requested = trainer.strategy.reduce_boolean_decision(requested, all=False)
        if not requested:
            return
        connector = trainer._signal_connector
        if not stepped:
            # Mid-accumulation: hold Lightning's flag back, or it would stop before the optimizer step.
            connector.received_sigterm = False
            return
        # A requeue signal on any rank makes the stop a requeue on every rank.
        requeue = STOP.signum == requeue_signal(trainer)
        if trainer.world_size > 1:
            requeue = trainer.strategy.reduce_boolean_decision(requeue, all=False)
        if requeue:
            STOP.signum = requeue_signal(trainer)
        path = checkpoint_path(trainer)
        trainer.save_checkpoint(path)
        STOP.checkpoint, STOP.step = path, trainer.global_step
        STOP.signum = STOP.signum or signal.SIGTERM
        rank_zero_info(f"mlm_adapt: {STOP.summary()}")
        if STOP.signum == requeue_signal(trainer) and lightning_requeues(trainer):
            trainer.strategy.barrier("mlm_adapt_requeue")  # every rank's part of the checkpoint is written
            if trainer.is_global_zero:
                requeue_slurm_job()
        connector.received_sigterm = True  # Lightning stops at the end of this batch (SIGTERMException)


def slurm_job_id() -> str | None:
    """This Slurm job's id as ``scontrol`` takes it (``ARRAYID_TASK`` for an array task), else ``None``."""
    array_job, array_task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array_job}_{array_task}" if array_job and array_task else os.environ.get("SLURM_JOB_ID")
    return job if job and re.fullmatch(r"[0-9_]+", job) else None


def requeue_slurm_job() -> None:
    """``scontrol requeue`` this job (it restarts with ``--ckpt_path last``); a failure is warned only."""
    job = slurm_job_id()
    if job is None:
        rank_zero_warn("mlm_adapt: requeue signal outside a Slurm job; not requeued")
        return
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
        failure = None if result.returncode == 0 else result.stderr.strip() or result.returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        failure = exc
    if failure is None:
        rank_zero_info(f"mlm_adapt: requeued Slurm job {job}; it continues from the checkpoint")
    else:
        rank_zero_warn(
            f"mlm_adapt: scontrol requeue {job} failed ({failure}); resubmit with --ckpt_path last"
        )
