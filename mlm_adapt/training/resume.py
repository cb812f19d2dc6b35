"""Surviving kills: atomic checkpoint files and a random stream that resumes exactly.

Exact mid-epoch resume has three parts. The data position is restored by torchdata's
``StatefulDataLoader`` (its ``state_dict`` rides in Lightning checkpoints, see ``MLMDataModule``); the
masks are a pure hash of ``(seed, epoch, example_id)`` (see ``mlm_adapt.masking.hashing``); and the remaining
randomness -- dropout -- is reseeded here before every training batch from
``(seed, epoch, batch_idx, rank)``, so it does not depend on how many random numbers the process drew
before (validation loaders, a fresh dataloader iterator after a restart, ...).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from mlm_adapt.data.fingerprint import corpus_fingerprint
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.loads import load_weights_only
from mlm_adapt.training.resume_lookup import CORPUS_KEY, conflict_message, resume_conflicts

# The temp files of AtomicCheckpointIO (and of its mkstemp-based predecessor): ".<name>.ckpt.<token>.tmp".
CHECKPOINT_TMP = re.compile(r"^\..+\.ckpt\.[A-Za-z0-9_]+\.tmp$")
# Temp files older than this process (module import) are leftovers of a killed run; younger ones may be a
# live write of another process and are left alone.
PROCESS_START = time.time()


def clean_checkpoint_tmp(directory: str | Path) -> list[Path]:
    """Deletes temp files of checkpoint writes killed before their rename (``.<name>.ckpt.<token>.tmp``).

    Returns:
        The deleted files.
    """
    directory = Path(directory)
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        if CHECKPOINT_TMP.match(entry.name) and entry.is_file() and not entry.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                if entry.stat().st_mtime < PROCESS_START:
                    entry.unlink()
                    removed.append(entry)
    return removed


def _create_tmp(target: Path) -> tuple[int, Path]:
    # os.open with 0o666: the file gets the user's umask (tempfile.mkstemp would make every checkpoint 0600).
    while True:
        tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoint IO with atomic local writes: a temp file next to the target, then ``os.replace``.

    Lightning's own local write goes through an fsspec transaction that stages the file in the system temp
    directory and moves it into place; when that directory is on another filesystem (node-local ``/tmp``,
    checkpoints on NFS/Lustre) the move degrades to copy-over-the-target, and a kill during the copy leaves
    ``last.ckpt`` truncated. Here the temp file sits next to the target, is fsynced, and is renamed over it,
    so a reader sees either the old or the new checkpoint, never a partial one. Remote URLs (``s3://``, ...)
    keep Lightning's behaviour: object-store uploads are already all-or-nothing. Files get the user's umask;
    temp files of an earlier killed write are deleted at the first save into their directory. Local
    checkpoints are read weights-only (:func:`~mlm_adapt.guard.loads.load_weights_only`).
    """

    def __init__(self) -> None:
        super().__init__()
        self._cleaned: set[Path] = set()

    def clean(self, directory: str | Path) -> None:
        """Removes stale temp files in ``directory`` once per run."""
        directory = Path(directory)
        if directory not in self._cleaned:
            clean_checkpoint_tmp(directory)
            self._cleaned.add(directory)

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
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        self.clean(target.parent)
        # A dotted name with a .tmp suffix: never mistaken for a checkpoint by ModelCheckpoint or "last".
        fd, tmp = _create_tmp(target)
        try:
            with os.fdopen(fd, "wb") as handle:
                torch.save(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        fsync_dir(target.parent)


def fsync_dir(directory: Path) -> None:
    """Makes renames in ``directory`` durable across a power loss (where the platform allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def batch_seed(seed: int, epoch: int, batch_idx: int, rank: int) -> int:
    """A 63-bit seed for one training batch on one rank (stable across processes and Python versions)."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{batch_idx}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class ExactResume(L.Callback):
    """Makes ``fit --ckpt_path last`` (or a SLURM requeue) continue exactly where the killed run was.

    Before every training batch, torch's generators (CPU and CUDA) are reseeded from
    ``(seed, epoch, batch_idx, global_rank)``: dropout then depends only on the batch position, which the
    checkpoint restores, and differs across ranks. It also installs :class:`AtomicCheckpointIO` when the
    strategy still uses Lightning's default checkpoint IO (a user-configured plugin is left alone), and
    keeps a fingerprint of the training corpus in checkpoints: resuming on a different corpus (the data
    loader position would point into other data) is refused with one line.

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
        saved = {"corpus": state_dict}
        conflicts = resume_conflicts(saved, {"corpus": {CORPUS_KEY: self.corpus_fingerprint}})
        if conflicts:
            raise MLMAdaptError(conflict_message("the checkpoint", conflicts))

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        torch.manual_seed(batch_seed(self.seed, trainer.current_epoch, batch_idx, trainer.global_rank))
