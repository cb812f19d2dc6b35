"""Staging directories: where an output is written before it is published by a rename.

A staging directory ``.<name>.staging-<token>`` sits next to the real output (same filesystem, so the
publishing rename is atomic) and holds:

- ``.mlm_adapt-staging.json``, the marker: format, the output's name, the token and the writer's pid/host.
  The writer holds an ``flock`` on it for the staging directory's whole life;
- ``new``: the file or directory being written;
- ``old``: while a directory output is being replaced, the earlier one (moved aside for one rename).

A leftover is cleaned only when it proves to be ours: a real directory (not a link) whose marker names
this output and the directory's own token, and whose lock can be taken (its writer is gone: the kernel
drops the lock of a killed process). A user's ``.export.staging-mynotes/`` has no such marker and is
never touched, whatever its name.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from mlm_adapt.guard.locks import owner_record, try_lock_file

STAGING_MARKER = ".mlm_adapt-staging.json"
_STAGING_FORMAT = "mlm_adapt staging"
PAYLOAD = "new"
BACKUP = "old"


def staging_prefix(target: Path) -> str:
    """The name every staging directory of ``target`` starts with."""
    return f".{target.name}.staging-"


@dataclass
class Staging:
    """A staging directory of this process: its path and the open (locked) marker."""

    path: Path
    marker_fd: int

    @property
    def payload(self) -> Path:
        """Where the new output is written."""
        return self.path / PAYLOAD

    @property
    def backup(self) -> Path:
        """Where an earlier directory output waits while it is replaced."""
        return self.path / BACKUP

    def remove(self) -> None:
        """Deletes the staging directory (and whatever it still holds) and drops its lock."""
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(self.marker_fd)


def create_staging(target: Path) -> Staging:
    """A fresh staging directory for the (resolved) ``target``, marked and locked as this process's.

    Created with mode 0777 (the umask applies), never ``tempfile``'s 0700.
    """
    while True:
        token = secrets.token_hex(6)
        path = target.parent / f"{staging_prefix(target)}{token}"
        try:
            path.mkdir(mode=0o777)
            break
        except FileExistsError:
            continue
    record = {"format": _STAGING_FORMAT, "target": target.name, "token": token, "created": time.time()}
    fd = os.open(path / STAGING_MARKER, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    try:
        os.write(fd, (json.dumps({**record, **owner_record()}) + "\n").encode())
        try_lock_file(fd)  # only we know the name yet: False means flock is unsupported (kept as live)
    except BaseException:
        os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        raise
    return Staging(path, fd)


def _proven_ours(entry: Path, target: Path) -> bool:
    """Whether ``entry`` is a staging directory of ``target`` by its marker (not by its name alone)."""
    try:
        if not stat.S_ISDIR(entry.lstat().st_mode):
            return False
        record = json.loads((entry / STAGING_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    token = entry.name.removeprefix(staging_prefix(target))
    return (
        isinstance(record, dict)
        and record.get("format") == _STAGING_FORMAT
        and record.get("target") == target.name
        and record.get("token") == token
    )


def _writer_gone(entry: Path) -> bool:
    try:
        fd = os.open(entry / STAGING_MARKER, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return try_lock_file(fd)
    finally:
        os.close(fd)


def clean_leftovers(target: Path) -> list[Path]:
    """Deletes the staging directories of ``target`` that killed writers left (proven ours, writer gone).

    A directory output interrupted between its two renames left the target absent and the earlier output
    in ``old``: it is renamed back first. Call with the target's lock held (directory outputs), so no live
    writer of this process's kind is mid-publish.

    Returns:
        The staging directories deleted.
    """
    removed: list[Path] = []
    try:
        entries = list(target.parent.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return removed
    for entry in entries:
        if not entry.name.startswith(staging_prefix(target)) or not _proven_ours(entry, target):
            continue
        if not _writer_gone(entry):
            continue  # a live writer's
        backup = entry / BACKUP
        if backup.is_dir() and not backup.is_symlink() and not os.path.lexists(target):
            os.rename(backup, target)
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def current_umask() -> int:
    """The process umask, read without changing it where ``/proc`` allows (no window for other threads)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as handle:
            line = next(line for line in handle if line.startswith("Umask:"))
        return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(path: Path, file_mode: int | None = None) -> None:
    """Gives every file under ``path`` mode ``0666 & ~umask`` and every directory ``0777 & ~umask``.

    Some writers ignore the umask (safetensors creates ``model.safetensors`` 0600, ``mkstemp`` 0600);
    after this the output has the modes ``touch``/``mkdir`` would give. ``file_mode`` overrides the mode
    of a single-file output (the mode of the file it replaces).
    """
    mask = current_umask()
    files, dirs = 0o666 & ~mask, 0o777 & ~mask
    if path.is_file() and not path.is_symlink():
        os.chmod(path, files if file_mode is None else file_mode)
        return
    os.chmod(path, dirs)
    for root, dirnames, filenames in os.walk(path):
        for name in dirnames:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), dirs)
        for name in filenames:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), files)


def _fsync(path: str | Path) -> None:
    """Flushes one file or directory entry to disk (where the platform allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_path(path: Path) -> None:
    """Flushes a file, or every file of a directory tree, to disk (where the platform allows it)."""
    paths = [path] if path.is_file() else [Path(r) / f for r, _, fs in os.walk(path) for f in fs]
    for item in paths:
        if not item.is_symlink():
            _fsync(item)


def fsync_dir(directory: Path) -> None:
    """Makes renames in ``directory`` durable across a power loss (where the platform allows it)."""
    _fsync(directory)
