"""Surviving kills: atomic checkpoint files and a random stream that resumes exactly.

Exact mid-epoch resume has three parts. The data position is restored by torchdata's
``StatefulDataLoader`` (its ``state_dict`` rides in Lightning checkpoints, see ``MLMDataModule``); the
masks are a pure hash of ``(seed, epoch, example_id)`` (see ``mlm_adapt.masking.collator``); and the remaining
randomness -- dropout -- is reseeded here before every training batch from
``(seed, epoch, batch_idx, rank)``, so it does not depend on how many random numbers the process drew
before (validation loaders, a fresh dataloader iterator after a restart, ...).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import lightning as L
import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from mlm_adapt.data.loader_state import corpus_fingerprint
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.loads import load_weights_only
from mlm_adapt.guard.outputs import Output, write_file
from mlm_adapt.training.continue_logs import drop_rows_after
from mlm_adapt.training.resume_lookup import CORPUS_KEY, conflict_message, resume_conflicts


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoint IO with atomic local writes through :func:`~mlm_adapt.guard.outputs.write_file`.

    Lightning's own local write goes through an fsspec transaction that stages the file in the system temp
    directory and moves it into place; when that directory is on another filesystem (node-local ``/tmp``,
    checkpoints on NFS/Lustre) the move degrades to copy-over-the-target, and a kill during the copy leaves
    ``last.ckpt`` truncated. Here the file is written in a staging directory next to the target, fsynced,
    and renamed over it, so a reader sees either the old or the new checkpoint, never a partial one. A
    checkpoint name that is a symlink (``save_last: link``) is replaced, not written through. Remote URLs
    (``s3://``, ...) keep Lightning's behaviour: object-store uploads are already all-or-nothing. Files get
    the user's umask; staging directories of an earlier killed write are deleted (proven ours by their
    marker) at the next save of the same name. Local checkpoints are read weights-only
    (:func:`~mlm_adapt.guard.loads.load_weights_only`).
    """

    @override
    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> Any:
        if not isinstance(get_filesystem(path), LocalFileSystem):
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        if map_location is None:
            map_location = lambda storage, loc: storage  # noqa: E731 -- Lightning's default: keep devices
        return load_weights_only(path, key="ckpt_path", map_location=map_location)

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        with (
            write_file(Output(path, key="checkpoint", directory=False, follow_link=False)) as staged,
            # A Python file: a full disk is then an OSError (ENOSPC), not torch's "unexpected pos".
            open(staged, "wb") as handle,
        ):
            torch.save(checkpoint, handle)


def batch_seed(seed: int, epoch: int, batch_idx: int, rank: int) -> int:
    """A 63-bit seed for one training batch on one rank (stable across processes and Python versions)."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{batch_idx}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def check_corpus(saved_state: dict[str, Any], fingerprint: str | None, checkpoint: str) -> None:
    """Refuses a resume whose training corpus differs from the checkpoint's (``ExactResume``'s state)."""
    conflicts = resume_conflicts({"corpus": saved_state}, {"corpus": {CORPUS_KEY: fingerprint}})
    if conflicts:
        raise MLMAdaptError(conflict_message(checkpoint, conflicts))


class ResumeCheck(L.Callback):
    """The corpus half of the resume check, before anything is written; then the CSV log is continued.

    The CLI puts it first among the callbacks: its ``setup`` runs right after the data is set up and
    before any other callback's (the config file, the export's checks), so a refused resume leaves the
    run directory as it was. Only an accepted resume drops the CSV rows past the checkpoint.

    Args:
        saved_state: ``ExactResume``'s state in the checkpoint (its corpus fingerprint).
        log_step: The last logger step the checkpoint covers.
        checkpoint: The checkpoint's path, for the refusal.
    """

    def __init__(self, saved_state: dict[str, Any], log_step: int, checkpoint: str):
        self.saved_state = dict(saved_state)
        self.log_step = log_step
        self.checkpoint = checkpoint

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        datamodule = getattr(trainer, "datamodule", None)
        fingerprint = corpus_fingerprint(datamodule) if datamodule is not None else None
        check_corpus(self.saved_state, fingerprint, self.checkpoint)
        drop_rows_after(trainer.loggers, self.log_step)  # accepted: nothing was written before this


class ExactResume(L.Callback):
    """Makes ``fit --ckpt_path last`` (or a SLURM requeue) continue exactly where the killed run was.

    Before every training batch, torch's generators (CPU and CUDA) are reseeded from
    ``(seed, epoch, batch_idx, global_rank)``: dropout then depends only on the batch position, which the
    checkpoint restores, and differs across ranks. It also installs :class:`AtomicCheckpointIO` when the
    strategy still uses Lightning's default checkpoint IO (a user-configured plugin is left alone), and
    keeps a fingerprint of the training corpus in checkpoints: resuming on a different corpus (the data
    loader position would point into other data) is refused with one line.

    The CLI compares the corpus earlier, before anything is written (:class:`ResumeCheck`); here it is
    compared when the checkpoint is restored (a plain ``trainer.fit(ckpt_path=...)``).

    Args:
        seed: Base seed; default: the ``seed_everything`` value (``PL_GLOBAL_SEED``), else 0.
        atomic_checkpoints: Install :class:`AtomicCheckpointIO`.
    """

    def __init__(self, seed: int | None = None, atomic_checkpoints: bool = True):
        self.seed = seed
        self.atomic_checkpoints = atomic_checkpoints
        self.corpus_fingerprint: str | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.seed is None:
            self.seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        if self.atomic_checkpoints and type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        datamodule = getattr(trainer, "datamodule", None)
        if stage == "fit" and datamodule is not None:  # set up before the callbacks: its data is ready
            self.corpus_fingerprint = corpus_fingerprint(datamodule)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {CORPUS_KEY: self.corpus_fingerprint} if self.corpus_fingerprint else {}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Called when fit restores a checkpoint, after setup: the current corpus is known.
        check_corpus(state_dict, self.corpus_fingerprint, "the checkpoint")

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        torch.manual_seed(batch_seed(self.seed, trainer.current_epoch, batch_idx, trainer.global_rank))
