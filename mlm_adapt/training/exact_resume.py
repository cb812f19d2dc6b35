"""Exact resume: a resumed run draws the same batches, masks and dropout as the run it continues.

torchdata's ``StatefulDataLoader`` restores the data position (its ``state_dict`` rides in checkpoints),
the masks are a pure hash of ``(seed, epoch, example_id)`` (``mlm_adapt.masking.collator``), and
:class:`ExactResume` reseeds dropout per batch and puts the loader at the checkpoint's position, also on
another number of ranks. Whether a checkpoint may be resumed at all is :mod:`mlm_adapt.training.resume`'s.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.data import _set_sampler_epoch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from mlm_adapt.data.loader_state import convert_loader_state
from mlm_adapt.data.samplers import EpochSampler, LengthGroupedEpochSampler
from mlm_adapt.training.checkpoint_files import AtomicCheckpointIO
from mlm_adapt.training.resume import WORLD_KEY, saved_record


def batch_seed(seed: int, epoch: int, batch_idx: int, rank: int) -> int:
    """A 63-bit seed for one training batch on one rank (stable across processes and Python versions)."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{batch_idx}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def continue_on_other_world(
    trainer: L.Trainer, epoch: int, batches_drawn: int, saved_world_size: int
) -> None:
    """Continues the checkpoint's epoch, written by ``saved_world_size`` ranks that had each drawn
    ``batches_drawn`` batches of it, on this trainer's ranks, at the same place of the epoch's global
    example order (:meth:`EpochSampler.resume_at`), and says in one line what changes.

    Every rank draws the epoch's global order in turn, so the examples seen so far are the first
    ``batches_drawn x batch size x saved ranks`` of it, whatever the number of ranks; the resumed run takes
    the rest in order, in global batches of its own size. Lightning's count of the epoch's batches is moved
    to the same place, so the epoch ends where the order does.
    """
    world_size = trainer.world_size
    loaders = trainer.fit_loop._combined_loader.flattened
    batch_size = int(getattr(loaders[0], "batch_size", None) or 1)
    consumed = batches_drawn * batch_size * saved_world_size
    samplers = [getattr(loader, "sampler", None) for loader in loaders]
    exact = all(isinstance(s, EpochSampler) for s in samplers)
    for sampler in samplers:
        if isinstance(sampler, EpochSampler):
            sampler.resume_at(epoch, consumed)
    progress = trainer.fit_loop.epoch_loop.batch_progress.current
    shift = consumed // (batch_size * world_size) - progress.ready
    for counter in ("ready", "started", "processed", "completed"):
        setattr(progress, counter, max(0, getattr(progress, counter) + shift))
    grouped = any(isinstance(s, LengthGroupedEpochSampler) for s in samplers)
    order = (
        "data.blocks.group_by_length groups the order by the number of ranks, so the remaining examples come "
        "in another order"
        if grouped
        else f"the epoch's example order continues at example {consumed}"
        if exact
        else "the loader is not mlm_adapt's sampler: its order restarts"
    )
    rank_zero_info(
        f"mlm_adapt: resuming on {world_size} rank(s) instead of the checkpoint's {saved_world_size}: "
        f"a global batch is {batch_size * world_size} examples instead of {batch_size * saved_world_size} "
        f"(data.batch_size {batch_size} x ranks); {order}"
    )


def as_saved_in_the_epoch(checkpoint: dict[str, Any]) -> None:
    """Writes a checkpoint saved after the epoch loop stopped (``on_train_epoch_end``, the validation
    ``on_train_end`` runs, the end of fit) the way one saved at its last batch's validation reads.

    Lightning counts the epoch processed (and, after its end hooks, completed) when it stops, also at
    ``max_steps`` before the epoch's data ran out; resumed from such a checkpoint (``--trainer.max_steps``
    raised) it would start the next epoch at the stopped epoch's loader position, leaving the rest of the
    epoch untrained and skipping the start of the next, or, at an epoch's end, skip an epoch's order.
    Written as still in its epoch, the resumed run finishes the epoch from the loader's position (none
    left after its last batch) and goes on to the next, as a run that had not stopped.
    """
    fit_loop = (checkpoint.get("loops") or {}).get("fit_loop")
    if not fit_loop:
        return
    progress = fit_loop["epoch_progress"]
    if progress["current"]["processed"] != progress["current"]["started"]:
        return  # saved within the epoch: Lightning resumes it as it is
    for counts in (progress["total"], progress["current"]):
        counts["processed"] = counts["completed"] = counts["started"] - 1


class ExactResume(L.Callback):
    """Makes ``fit --ckpt_path last`` (or a SLURM requeue) continue exactly where the killed run was,
    and a finished run extended (``--trainer.max_steps`` raised) continue as one longer run.

    Before every training batch, torch's generators (CPU and CUDA) are reseeded from
    ``(seed, epoch, batch_idx, global_rank)``: dropout then depends only on the batch position, which the
    checkpoint restores, not on the random numbers the process drew before (validation loaders, a fresh
    dataloader iterator), and differs across ranks. It installs
    :class:`~mlm_adapt.training.checkpoint_files.AtomicCheckpointIO` over Lightning's default.

    Args:
        seed: Base seed; default: the ``seed_everything`` value (``PL_GLOBAL_SEED``), else 0.
    """

    def __init__(self, seed: int | None = None):
        self.seed = seed
        self._saved_world_size: int | None = None
        self._loader_states: list[dict[str, Any]] = []
        self._loader_epoch = 0

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.seed is None:
            self.seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()

    @override
    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._saved_world_size = saved_record(checkpoint)[WORLD_KEY]  # None: not recorded, taken as unchanged
        fit_loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
        self._loader_states = list((fit_loop.get("state_dict") or {}).get("combined_loader") or [])
        current = (fit_loop.get("epoch_progress") or {}).get("current") or {}
        # The epoch the loader's position belongs to: the last one started.
        self._loader_epoch = int(current.get("started", 1)) - 1

    @override
    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        as_saved_in_the_epoch(checkpoint)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # The run's own seed: a number given again is the same (a change is refused, training/resume.py);
        # `seed_everything: true` drew another one at this start.
        self.seed = state_dict.get("seed", self.seed)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Puts the train loader at the checkpoint's position, in the checkpoint's epoch, before its first
        batch is drawn.

        Lightning loads the loader's saved position only when it builds the loader after the restore. A
        ``configure_optimizers`` that reads ``trainer.estimated_stepping_batches`` under a finite
        ``max_epochs`` (the linear schedule under ``configs/domain.yaml``) builds it before, and the resumed
        run then restarts the epoch's order (a different batch at the first resumed step). Its iterator was
        also made before the sampler learned the restored epoch, so workers that prefetched at the start
        drew from epoch 0's order. Either way the position is loaded here again, after the epoch is set,
        and a new iterator is made from it."""
        states, self._loader_states = self._loader_states, []
        fit_loop = trainer.fit_loop
        loaders, fetcher = fit_loop._combined_loader, fit_loop._data_fetcher
        if not states or loaders is None or fetcher is None:
            return
        epoch = fit_loop.epoch_progress.current.processed
        for loader in loaders.flattened:
            _set_sampler_epoch(loader, epoch)
        # Saved at the last batch of an epoch, the position is that epoch's end: the restored run starts
        # the next epoch (Lightning counted it finished), from its first batch.
        in_saved_epoch = epoch == self._loader_epoch
        if self._saved_world_size not in (None, trainer.world_size):
            drawn = [convert_loader_state(state, 0).get("_num_yielded", 0) for state in states]
            continue_on_other_world(
                trainer, epoch, int(drawn[0]) if in_saved_epoch else 0, self._saved_world_size
            )
        elif in_saved_epoch:
            loaders._load_state_dicts(states)
        fit_loop._combined_loader_states_to_load = []  # loaded: Lightning must not load it a second time
        iter(fetcher)

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        torch.manual_seed(batch_seed(self.seed, trainer.current_epoch, batch_idx, trainer.global_rank))
