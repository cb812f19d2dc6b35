"""Exclusive locks on output paths, and the staging directories outputs are written in.

Locks: re-entrant ``fcntl.flock`` on ``.<name>.lock`` beside the real output (two spellings of a path share
it), holding a ``{pid, host}`` record for the "busy" message, removed on release; its inode is re-checked
after locking. A file there that is not our record is refused, never truncated; a dead owner's record is
taken over with one line. Without ``flock`` (Lustre without ``-o flock``, Windows) the write goes on
unlocked after a warning: the atomic publish still holds. Forked workers close inherited lock files and,
on Linux, die with their parent.

Staging: an output is written in ``.<name>.staging-<token>/new`` beside its target (one filesystem: the
publishing rename is atomic); a directory output being replaced waits in ``old``. The marker
:data:`STAGING_MARKER` names the target and token and is ``flock``-ed by its writer for the directory's
life. A leftover is deleted only when its marker proves it ours and its lock can be taken (the kernel
drops a killed writer's): a user's ``.export.staging-mynotes/`` is never touched.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mlm_adapt.errors import MLMAdaptError

try:
    import fcntl
except ImportError:  # Windows: no flock; writes go on unlocked
    fcntl = None

STAGING_MARKER = ".mlm_adapt-staging.json"
_STAGING_FORMAT, _LOCK_FORMAT = "mlm_adapt staging", "mlm_adapt lock"
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h

_held: dict[Path, list[int]] = {}  # lock file -> [fd, depth]; fd -1: unlocked (flock unsupported)
_registry = threading.Lock()
_parent_at_fork: list[int] = []


def _before_fork() -> None:
    _parent_at_fork[:] = [os.getpid()]


def _in_forked_child() -> None:
    """A forked worker inherits no lock and dies with its parent: ``flock`` belongs to the open file, which a
    fork shares, so a worker outliving its killed parent would keep the parent's locks held."""
    global _registry
    _registry = threading.Lock()  # another thread may have held it at the fork
    for fd, _depth in _held.values():
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
    _held.clear()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if _parent_at_fork and os.getppid() != _parent_at_fork[0]:
            os._exit(1)  # the parent died before prctl took effect


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_in_forked_child)


def lock_path(target: Path) -> Path:
    """The lock file of a (resolved) output path."""
    return target.parent / f".{target.name}.lock"


def _owner() -> dict[str, object]:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _holder(path: Path) -> str:
    with contextlib.suppress(OSError, ValueError, TypeError):
        record = json.loads(path.read_text(encoding="utf-8"))
        return f" (pid {int(record['pid'])} on {record['host']})"
    return ""


def _try_lock(fd: int) -> bool | None:
    """Takes the lock on an open file if free now (``True``); ``False``: held; ``None``: no ``flock`` here."""
    try:
        if fcntl is None:
            return None
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return None
        raise
    return True


def _claim(fd: int, path: Path, key: str, shown: str) -> None:
    """Refuses a lock file holding anything but our record; a record there is a dead owner's: taken over."""
    with os.fdopen(os.dup(fd), "r+", encoding="utf-8") as handle:
        text = handle.read()
        if text.strip():
            try:
                foreign = json.loads(text).get("format") != _LOCK_FORMAT
            except (ValueError, AttributeError):
                foreign = True
            if foreign:
                raise MLMAdaptError(
                    f"{key}: {path} exists and is not an mlm_adapt lock file; move it away to write {shown}"
                )
            owner = _holder(path) or " (owner unknown)"
            print(
                f"mlm_adapt: taking over the lock {path} of {shown}: its owner{owner} is gone (killed before "
                "it released the lock)",
                file=sys.stderr,
                flush=True,
            )
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"format": _LOCK_FORMAT, **_owner()}) + "\n")


def acquire(target: Path, key: str, shown: str, wait: bool = False) -> None:
    """Takes the exclusive (re-entrant) lock of ``target``, whose parent must exist, or refuses; with
    ``wait``, waits for the holder instead (one line says for whom), e.g. the node filling a shared cache."""
    path = lock_path(target)
    with _registry:
        if path in _held:
            _held[path][1] += 1
            return
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
            except OSError as exc:
                reason = "is a symbolic link; remove it" if exc.errno == errno.ELOOP else None
                raise MLMAdaptError(
                    f"{key}: {path} (the lock file of {shown}) {reason}"
                    if reason
                    else f"{key}: cannot create the lock file {path} for {shown}: {exc.strerror}"
                ) from None
            try:
                taken = _try_lock(fd)
            except OSError:
                os.close(fd)
                raise
            if taken is False and not wait:
                os.close(fd)
                raise MLMAdaptError(
                    f"{key}: {shown} is being written by another mlm_adapt process{_holder(path)}; wait "
                    "for it to finish or choose another directory"
                )
            if taken is False:
                print(f"mlm_adapt: waiting for {shown}{_holder(path)}", flush=True)
                fcntl.flock(fd, fcntl.LOCK_EX)
            if taken is None:
                os.close(fd)
                warnings.warn(
                    f"{path.parent} does not support file locks; writing {shown} unlocked", stacklevel=2
                )
                _held[path] = [-1, 1]
                return
            # A lock file removed (by a holder releasing) or replaced meanwhile locks nothing: retry.
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False)):
                    break
            os.close(fd)
        try:
            _claim(fd, path, key, shown)
        except BaseException:
            os.close(fd)
            raise
        _held[path] = [fd, 1]


def release(target: Path) -> None:
    """Releases a lock taken by :func:`acquire` (the lock file goes when the outermost holder releases)."""
    path = lock_path(target)
    with _registry:
        entry = _held.get(path)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[path]
        if entry[0] < 0:
            return
        # Unlinked while still locked: a waiter that opened this inode re-checks it and retries.
        with contextlib.suppress(OSError):
            if os.path.samestat(os.fstat(entry[0]), os.stat(path, follow_symlinks=False)):
                os.unlink(path)
        os.close(entry[0])


@contextlib.contextmanager
def locked(target: Path, key: str, shown: str, wait: bool = False) -> Iterator[None]:
    """Holds the exclusive lock of ``target`` for the ``with`` block (``wait``: see :func:`acquire`)."""
    acquire(target, key, shown, wait)
    try:
        yield
    finally:
        release(target)


@dataclass
class Staging:
    """A staging directory of this process: its path and the open (locked) marker."""

    path: Path
    marker_fd: int

    @property
    def payload(self) -> Path:  # the new output
        return self.path / "new"

    @property
    def backup(self) -> Path:  # an earlier directory output, while it is replaced
        return self.path / "old"

    def remove(self) -> None:
        """Deletes the staging directory (and whatever it still holds) and drops its lock."""
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(self.marker_fd)


def _staging_prefix(target: Path) -> str:
    return f".{target.name}.staging-"


def create_staging(target: Path) -> Staging:
    """A fresh staging directory for the (resolved) ``target``, marked and locked as this process's."""
    path = Path(tempfile.mkdtemp(prefix=_staging_prefix(target), dir=target.parent))
    token = path.name.removeprefix(_staging_prefix(target))
    record = {"format": _STAGING_FORMAT, "target": target.name, "token": token, **_owner()}
    fd = os.open(path / STAGING_MARKER, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
        _try_lock(fd)  # only we know the name yet; without flock it is kept as live
    except BaseException:
        os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        raise
    return Staging(path, fd)


def _is_dead_staging(entry: Path, target: Path) -> bool:
    """Whether ``entry`` is a staging directory of ``target`` by its marker and its writer is gone."""
    try:
        if not stat.S_ISDIR(entry.lstat().st_mode):
            return False
        record = json.loads((entry / STAGING_MARKER).read_text(encoding="utf-8"))
        expected = {"format": _STAGING_FORMAT, "target": target.name}
        expected["token"] = entry.name.removeprefix(_staging_prefix(target))
        if not isinstance(record, dict) or any(record.get(k) != v for k, v in expected.items()):
            return False
        fd = os.open(entry / STAGING_MARKER, os.O_RDONLY | os.O_NOFOLLOW)
    except (OSError, ValueError):
        return False
    try:
        return _try_lock(fd) is True  # without flock, liveness is unknown: kept as live
    finally:
        os.close(fd)


def clean_leftovers(target: Path) -> None:
    """Deletes the staging directories of ``target`` that killed writers left (proven ours, writer gone),
    after renaming back an earlier output left in ``old`` between the two renames of a replacement. Called
    with the target's lock held for directory outputs."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in target.parent.iterdir():
            if entry.name.startswith(_staging_prefix(target)) and _is_dead_staging(entry, target):
                backup = entry / "old"
                if backup.is_dir() and not backup.is_symlink() and not os.path.lexists(target):
                    os.rename(backup, target)
                shutil.rmtree(entry, ignore_errors=True)
