"""The export directory on disk: what ``overwrite`` may replace, and replacing it atomically.

Pure filesystem code (no torch). The rules:

- Every export holds a marker file, :data:`MARKER`, listing the entries the export wrote. ``overwrite``
  replaces only such a directory, and only when it holds nothing else; anything else is refused with one
  line. So ``overwrite`` can never delete a user's files.
- Never, with or without ``overwrite``: the current directory (or a directory containing it), a run
  directory (or a directory containing it: checkpoints and logs live there) and a directory containing an
  input file (the checkpoint being exported, the base model, the corpus).
- The new export is written and checked in a staging directory next to the target, then swapped in with
  two renames (target -> backup, staging -> target); only then is the backup deleted. A kill at any moment
  leaves the old or the new export complete: before the first rename the old one is in place, after the
  second the new one; in between the target is absent and the old export sits complete in the backup,
  which :func:`recover` (run before every export) renames back.
- Staging directories and backups of a killed export are ours (by name) and are cleaned by the next export
  (temp files of killed checkpoint writes: :func:`mlm_adapt.training.resume.clean_checkpoint_tmp`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.training.resume import fsync_dir

MARKER = ".mlm_adapt-export.json"
_MARKER_FORMAT = "mlm_adapt export"
# Created when this module is imported (process start, in practice): leftovers older than this belong to
# an earlier, killed run; younger ones may be another live process's and are left alone.
PROCESS_START = time.time()


def _staging_prefix(target: Path) -> str:
    return f".{target.name}.staging-"


def _backup_prefix(target: Path) -> str:
    return f".{target.name}.old-"


def _is_within(path: Path, directory: Path) -> bool:
    """``path`` is ``directory`` or lies inside it (both resolved)."""
    return path == directory or directory in path.parents


def _real(path: str | Path) -> Path:
    # resolve(): symlinks and ".." must not hide that two paths are the same directory.
    return Path(path).expanduser().resolve()


def _glob_root(pattern: str | Path) -> Path:
    """The directory part of a path or glob before its first wildcard (``corpus/*.txt`` -> ``corpus``)."""
    parts = Path(pattern).expanduser().parts
    fixed = []
    for part in parts:
        if any(c in part for c in "*?["):
            break
        fixed.append(part)
    return _real(Path(*fixed)) if fixed else _real(".")


def write_marker(directory: str | Path) -> None:
    """Writes :data:`MARKER` into ``directory``, listing every entry it holds (the export's own files).

    Written last, after the files were checked, so a directory with a valid marker is a complete export.
    """
    directory = Path(directory)
    files = sorted(p.name for p in directory.iterdir() if p.name != MARKER)
    payload = {"format": _MARKER_FORMAT, "version": 1, "files": files}
    (directory / MARKER).write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")


def export_files(directory: str | Path) -> list[str] | None:
    """The entries listed by ``directory``'s marker, or ``None`` when it has no valid marker."""
    try:
        payload = json.loads((Path(directory) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(payload, dict) or payload.get("format") != _MARKER_FORMAT:
        return None
    files = payload.get("files")
    return [str(f) for f in files] if isinstance(files, list) else None


def foreign_entries(directory: str | Path) -> list[str] | None:
    """Entries of ``directory`` that no export wrote (``None``: it is not an export at all)."""
    listed = export_files(directory)
    if listed is None:
        return None
    return sorted(p.name for p in Path(directory).iterdir() if p.name != MARKER and p.name not in listed)


def is_complete_export(directory: str | Path) -> bool:
    """A directory with a valid marker whose listed entries are all present and that holds nothing else."""
    listed = export_files(directory)
    if listed is None:
        return False
    present = {p.name for p in Path(directory).iterdir()} - {MARKER}
    return present == set(listed)


def recover(output_dir: str | Path) -> None:
    """Repairs what a killed export left next to ``output_dir`` (run before every export).

    A backup of a swap interrupted between its two renames is renamed back when the target is absent (the
    old export returns), and deleted when the target is a complete export (the swap had finished).
    Staging directories older than this process are deleted. Nothing without our names is touched, and a
    backup is only ever deleted when it holds a valid marker.
    """
    target = Path(output_dir).expanduser().absolute()
    parent = target.parent
    if not parent.is_dir():
        return
    backups = sorted(
        (p for p in parent.iterdir() if p.name.startswith(_backup_prefix(target)) and p.is_dir()),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for backup in backups:
        if export_files(backup) is None:
            continue  # not ours after all: leave it
        if not target.exists():
            os.rename(backup, target)
        elif is_complete_export(target):
            shutil.rmtree(backup)
    for staging in parent.iterdir():
        if staging.name.startswith(_staging_prefix(target)) and staging.is_dir():
            with contextlib.suppress(FileNotFoundError):
                if staging.stat().st_mtime < PROCESS_START:
                    shutil.rmtree(staging, ignore_errors=True)


def check_output_dir(
    output_dir: str | Path,
    overwrite: bool,
    key: str = "--output_dir",
    *,
    run_dirs: Iterable[str | Path] = (),
    inputs: Mapping[str, Iterable[str | Path]] | None = None,
) -> Path:
    """Refuses, with one line, an output directory the export must not write (checked before any work).

    Args:
        output_dir: The export directory.
        overwrite: Whether an earlier export there may be replaced.
        key: The option that named ``output_dir``, for messages.
        run_dirs: Directories of the run (default root, log and checkpoint directories): never replaced,
            nor any directory containing one.
        inputs: Input paths or globs by the option that named them (``--ckpt_path``: [...]); the export
            must not contain any of them.

    Returns:
        The resolved output directory.
    """
    recover(output_dir)
    path = _real(output_dir)
    cwd = _real(Path.cwd())
    if _is_within(cwd, path):
        what = "is the current directory" if path == cwd else f"contains the current directory {cwd}"
        raise MLMAdaptError(f"{key}: {output_dir} {what}; give a directory of its own, e.g. ./export")
    for run_dir in run_dirs:
        run = _real(run_dir)
        if _is_within(run, path):
            what = "is the run directory" if path == run else f"contains the run directory {run}"
            raise MLMAdaptError(
                f"{key}: {output_dir} {what} (checkpoints and logs); give a directory of its own, "
                f"e.g. {run / 'export'}"
            )
    for input_key, paths in (inputs or {}).items():
        for item in paths:
            if item and _is_within(_glob_root(item), path):
                raise MLMAdaptError(
                    f"{key}: {output_dir} contains the input {item} ({input_key}); "
                    "give a directory that holds no input"
                )
    if path.exists() and not path.is_dir():
        raise MLMAdaptError(f"{key}: {output_dir} is a file; give a directory")
    if not path.is_dir() or not any(path.iterdir()):
        return path
    foreign = foreign_entries(path)
    if not overwrite:
        hint = "pass overwrite to replace the earlier export" if foreign == [] else "choose another directory"
        raise MLMAdaptError(f"{key}: {output_dir} is not empty; {hint} (overwrite: --overwrite)")
    if foreign is None:
        raise MLMAdaptError(
            f"{key}: {output_dir} is not an mlm_adapt export (no {MARKER}); overwrite replaces only an "
            "earlier export: choose another directory or empty this one yourself"
        )
    if foreign:
        raise MLMAdaptError(
            f"{key}: {output_dir} holds {', '.join(foreign[:3])}, which no export wrote; overwrite replaces "
            "only an export's own files: move it away or choose another directory"
        )
    return path


def make_staging(output_dir: str | Path) -> Path:
    """A fresh, empty staging directory next to ``output_dir`` (same filesystem, so renames are atomic).

    Created with the process umask (``tempfile.mkdtemp`` would make it 0700, and the export would keep it).
    """
    target = Path(output_dir).expanduser().absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    while True:
        staging = target.parent / f"{_staging_prefix(target)}{secrets.token_hex(4)}"
        try:
            staging.mkdir(mode=0o777)
            return staging
        except FileExistsError:
            continue


def publish(staging: str | Path, output_dir: str | Path, key: str = "--output_dir") -> None:
    """Puts the complete export in ``staging`` at ``output_dir``, replacing an earlier export atomically.

    Writes the marker into ``staging``, then: an absent or empty target is replaced by one rename; an
    earlier export is renamed to a backup, the staging directory renamed to the target, and the backup
    deleted. Whatever else is at the target (it changed since :func:`check_output_dir`) is refused.
    """
    staging, target = Path(staging), Path(output_dir).expanduser().absolute()
    write_marker(staging)
    if target.is_dir() and any(target.iterdir()):
        if foreign_entries(target) != []:
            raise MLMAdaptError(
                f"{key}: {output_dir} changed while the export was written and is no longer an earlier "
                "export; nothing was replaced"
            )
        backup = target.parent / f"{_backup_prefix(target)}{secrets.token_hex(4)}"
        os.rename(target, backup)
        os.rename(staging, target)
        fsync_dir(target.parent)
        shutil.rmtree(backup)
    else:
        # rename() replaces an empty directory in one step and fails if files appeared meanwhile.
        os.rename(staging, target)
        fsync_dir(target.parent)


def remove_staging(staging: str | Path) -> None:
    """Deletes a staging directory after a failed export (it is ours: created by :func:`make_staging`)."""
    shutil.rmtree(staging, ignore_errors=True)
