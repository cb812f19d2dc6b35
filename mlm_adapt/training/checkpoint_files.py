"""A run's checkpoint and log files: which checkpoint ``--ckpt_path last`` means, the logger version a
resumed run writes to, atomic checkpoint writes, and a CSV log that continues.

Without a ``ModelCheckpoint.dirpath`` (the shipped configs) Lightning writes checkpoints to
``<save_dir>/<name>/<version>/checkpoints`` of the first logger, and a new run gets a new version, so
Lightning's own ``"last"`` lookup (in the new, empty version) never finds the previous run:
:func:`find_last_checkpoint` searches every version and every fixed directory instead. Whether the
checkpoint found may be resumed is :mod:`mlm_adapt.training.resume`'s question.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from typing_extensions import override

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.loads import load_weights_only
from mlm_adapt.guard.outputs import Output, write_file

# Lightning's names for the last checkpoint: last.ckpt, and last-v1.ckpt ... with its version counter.
LAST_NAME = re.compile(r"^last(-v\d+)?\.ckpt$")
CHECKPOINTS_SUBDIR = "checkpoints"


def find_last_checkpoint(
    version_roots: Iterable[str | Path] = (), fixed_dirs: Iterable[str | Path] = ()
) -> Path | None:
    """The newest ``last*.ckpt`` (by modification time, Lightning's rule) in ``*/checkpoints`` of the logger
    directories ``<save_dir>/<name>`` (every version of the run) and in ``ModelCheckpoint.dirpath``s."""
    found = [p for root in version_roots for p in Path(root).glob(f"*/{CHECKPOINTS_SUBDIR}/last*.ckpt")]
    found += [p for directory in fixed_dirs for p in Path(directory).glob("last*.ckpt")]
    candidates = [p for p in found if LAST_NAME.match(p.name) and p.is_file()]
    # Newest write wins; the path breaks ties so the choice does not depend on directory order.
    return max(candidates, key=lambda p: (p.stat().st_mtime_ns, str(p)), default=None)


def version_of(checkpoint: str | Path, version_root: str | Path) -> str | None:
    """``version_3`` when ``checkpoint`` is ``<version_root>/version_3/checkpoints/<file>``, else ``None``."""
    checkpoint, root = Path(checkpoint).resolve(), Path(version_root).resolve()
    if checkpoint.parent.name != CHECKPOINTS_SUBDIR or checkpoint.parent.parent.parent != root:
        return None
    return checkpoint.parent.parent.name


# Loggers that keep a run in <save_dir>/<name>/<version> (where ModelCheckpoint writes without dirpath).
VERSIONED_LOGGERS = ("CSVLogger", "TensorBoardLogger")
# A logger ``save_dir`` that means "the run's root directory", whatever --trainer.default_root_dir says.
RUN_ROOT = "${trainer.default_root_dir}"


def _entries(value: Any) -> list[Any]:
    if value is None or isinstance(value, bool):
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def versioned_logger_args(logger_config: Any) -> list[Any]:
    """``init_args`` of the loggers of ``trainer.logger`` (as LightningCLI parsed it) that write versions."""
    found = []
    for entry in _entries(logger_config):
        class_path = str(getattr(entry, "class_path", ""))
        init_args = getattr(entry, "init_args", None)
        if class_path.rsplit(".", 1)[-1] in VERSIONED_LOGGERS and init_args is not None:
            found.append(init_args)
    return found


def root_loggers(trainer_config: Any) -> None:
    """Loggers whose ``save_dir`` is :data:`RUN_ROOT` write under ``trainer.default_root_dir``, so one
    ``--trainer.default_root_dir`` (a Slurm job's ``ROOT``) moves the whole run. Only this one value is
    substituted (the configs are plain YAML, not OmegaConf); ``trainer_config`` is changed in place."""
    root = str(trainer_config.default_root_dir or ".")
    for entry in _entries(trainer_config.logger):
        init_args = getattr(entry, "init_args", None)
        if init_args is not None and init_args.get("save_dir") == RUN_ROOT:
            init_args.save_dir = root


def logger_root(init_args: Any, default_root_dir: str | Path) -> Path:
    """``<save_dir>/<name>``: the directory holding a versioned logger's ``version_N`` directories."""
    save_dir = Path(getattr(init_args, "save_dir", None) or default_root_dir)
    name = getattr(init_args, "name", None)
    return save_dir / name if name else save_dir


def checkpoint_dirs(callbacks_config: Any) -> list[Path]:
    """The ``dirpath`` of every configured ``ModelCheckpoint`` that has one (fixed directories)."""
    dirs = []
    for entry in _entries(callbacks_config):
        if str(getattr(entry, "class_path", "")).endswith("ModelCheckpoint"):
            dirpath = getattr(getattr(entry, "init_args", None), "dirpath", None)
            if dirpath:
                dirs.append(Path(dirpath))
    return dirs


def resolve_resume(config: Any, follow_version: bool = True) -> None:
    """Turns a parsed ``fit`` config's ``ckpt_path`` into the checkpoint to resume, and continues its logs.

    ``last`` becomes the newest ``last*.ckpt`` of the run, or ``None`` with a note when the run has none
    yet (a first run of a requeue script); ``best`` and a model registry are refused. When the checkpoint
    lies in a version directory of the first logger, every versioned logger that has that version is set
    to it, so the resumed run writes where the killed run did. Other values (a path, ``hpc``) are left to
    Lightning.

    Args:
        config: The ``fit`` (``validate``, ``test``) section of LightningCLI's parsed config (changed).
        follow_version: Set the loggers to the checkpoint's version (``fit``; not ``validate``/``test``).
    """
    ckpt_path = config.ckpt_path
    if ckpt_path == "best":  # Lightning's best is known only inside the fit that saved it
        raise MLMAdaptError(
            "ckpt_path best: the best checkpoint is known only inside the fit that saved it; give its .ckpt "
            "path (ModelCheckpoint's filename, in the run's checkpoints directory)"
        )
    if str(ckpt_path).split(":")[0] == "registry":
        raise MLMAdaptError(
            f"ckpt_path {ckpt_path}: Lightning's model registry is not used by mlm_adapt; give a .ckpt file "
            "the trainer wrote, last or hpc"
        )
    if not ckpt_path or ckpt_path == "hpc":
        return
    trainer = config.trainer
    default_root = Path(trainer.default_root_dir or ".")
    entries = _entries(trainer.logger)
    versioned = versioned_logger_args(trainer.logger)
    first = getattr(entries[0], "init_args", None) if entries else None
    fixed = checkpoint_dirs(trainer.callbacks)
    # Where ModelCheckpoint writes without dirpath: the first logger's version, else the root.
    if trainer.logger is False:
        roots, fixed = [], [*fixed, default_root / CHECKPOINTS_SUBDIR]
    elif not entries:
        roots = [default_root / "lightning_logs"]  # Lightning's default logger
    else:
        roots = [logger_root(first, default_root)] if any(first is v for v in versioned) else []
    if ckpt_path == "last":
        found = find_last_checkpoint(roots, fixed)
        if found is None:
            where = [str(r / "*" / CHECKPOINTS_SUBDIR) for r in roots] + [str(d) for d in fixed]
            if not follow_version:  # validate/test have nothing to evaluate
                raise MLMAdaptError(
                    f"ckpt_path last: no last.ckpt in {', '.join(where)}; give the .ckpt path"
                )
            rank_zero_info(f"mlm_adapt: ckpt_path last: no last.ckpt in {', '.join(where)}; new run")
            config.ckpt_path = None
            return
        config.ckpt_path = str(found)
        rank_zero_info(f"mlm_adapt: ckpt_path last: resuming {found}")
    version = version_of(config.ckpt_path, roots[0]) if roots and versioned and follow_version else None
    if version is None:
        return
    for args in versioned:
        if args is first or (logger_root(args, default_root) / version).is_dir():
            args.version = version


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoint IO with atomic local writes (:func:`~mlm_adapt.guard.outputs.write_file`) and weights-only
    local reads (:func:`~mlm_adapt.guard.loads.load_weights_only`).

    Lightning stages a local write in the system temp directory; when that is another filesystem
    (node-local ``/tmp``, checkpoints on NFS/Lustre) the move degrades to a copy over the target, and a kill
    during it leaves ``last.ckpt`` truncated. Here the file is staged next to the target, fsynced and
    renamed over it; a symlinked name (``save_last: link``) is replaced, not written through. Remote URLs
    keep Lightning's behaviour: object-store uploads are already all-or-nothing.
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


class _ContinuingWriter(ExperimentWriter):
    """Lightning's CSV writer without the deletion of an existing ``metrics.csv``; appends to it."""

    @override
    def _check_log_dir_exists(self) -> None:
        pass


def read_rows(metrics_csv: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The header and the rows of a CSV log."""
    with open(metrics_csv, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def _step(row: dict[str, str]) -> int:
    try:
        return int(float(row.get("step") or 0))
    except ValueError:
        return 0  # rows without a step are kept


def _csv_logs(loggers: list[Logger]) -> list[tuple[CSVLogger, Path]]:
    if rank_zero_only.rank != 0:  # the CSV logger writes on rank 0 only
        return []
    found = [
        (logger, Path(logger.log_dir) / "metrics.csv") for logger in loggers if isinstance(logger, CSVLogger)
    ]
    return [(logger, metrics_csv) for logger, metrics_csv in found if metrics_csv.is_file()]


def attach_csv_logs(loggers: list[Logger]) -> list[Path]:
    """Makes every ``CSVLogger`` with a ``metrics.csv`` append to it instead of deleting it (which Lightning
    does when it opens a version directory); writes nothing. Call before the trainer opens its loggers; a
    refused resume then leaves the file untouched (:class:`ResumeCheck` drops the rows past the checkpoint
    once the resume is accepted). Returns the attached files."""
    found = _csv_logs(loggers)
    for logger, metrics_csv in found:
        writer = _ContinuingWriter(log_dir=logger.log_dir)
        writer.metrics_keys = read_rows(metrics_csv)[0]
        logger._experiment = writer  # the property returns it instead of opening (and wiping) the file
    return [metrics_csv for _, metrics_csv in found]


def drop_rows_after(loggers: list[Logger], step: int) -> None:
    """Removes the rows logged after ``step`` (the checkpoint's last logger step) from every ``CSVLogger``'s
    ``metrics.csv``, atomically; other loggers are left alone (TensorBoard appends)."""
    for _, metrics_csv in _csv_logs(loggers):
        header, rows = read_rows(metrics_csv)
        kept = [row for row in rows if _step(row) <= step]
        if len(kept) == len(rows):
            continue
        with (
            write_file(Output(metrics_csv, key="trainer.logger", directory=False)) as staged,
            open(staged, "w", newline="", encoding="utf-8") as handle,
        ):
            writer = csv.DictWriter(handle, fieldnames=header)
            writer.writeheader()
            writer.writerows(kept)
