"""Exclusive locks on output paths: ``fcntl.flock`` on a lock file ``.<name>.lock`` beside the output.

The lock file is created next to the real (symlink-resolved) output, so two spellings of one directory
share one lock. It holds a small JSON record (pid, host) for the "busy" message and is removed on
release; the inode is re-checked after locking so a lock file removed and recreated meanwhile is never
trusted. A file at the lock's name that is not such a record (a user's) is refused, never truncated.
Locks are re-entrant within a process. Where ``flock`` is missing (Lustre mounted without ``-o flock``,
Windows) the write goes on unlocked after a warning: the atomic publish still holds, only concurrent
writers are no longer told apart. Forked workers close the lock files they inherit and, on Linux, die with
their parent, so no process but the command that took a lock can hold it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import signal
import socket
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

from mlm_adapt.errors import MLMAdaptError

try:
    import fcntl
except ImportError:  # Windows: no flock; writes go on unlocked (see the module docstring)
    fcntl = None

_LOCK_FORMAT = "mlm_adapt lock"
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
_held: dict[Path, list[int]] = {}  # lock file -> [fd, depth]; fd -1: unlocked (flock unsupported)
_registry = threading.Lock()


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_parent_at_fork: list[int] = []


def _before_fork() -> None:
    _parent_at_fork[:] = [os.getpid()]


def _in_forked_child() -> None:
    """A forked child (a ``datasets.map`` or DataLoader worker) inherits no lock and dies with its parent.

    ``flock`` belongs to the open file, which a fork shares: a worker left alive after its parent was killed
    (SIGKILL, the OOM killer) would keep every lock of the parent held, and each later run would be refused
    as if the parent still wrote. Closing the child's copies leaves the parent's locks as they are; and on
    Linux the kernel kills the child when its parent goes, so no idle worker outlives the command.
    """
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


def owner_record() -> dict[str, object]:
    """Who holds a lock or a staging directory: this process on this host."""
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _holder(path: Path) -> str:
    with contextlib.suppress(OSError, ValueError, TypeError):
        record = json.loads(path.read_text(encoding="utf-8"))
        return f" (pid {int(record['pid'])} on {record['host']})"
    return ""


def _open_lock(path: Path, key: str, shown: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise MLMAdaptError(
                f"{key}: {path} (the lock file of {shown}) is a symbolic link; remove it"
            ) from None
        raise MLMAdaptError(
            f"{key}: cannot create the lock file {path} for {shown}: {exc.strerror}"
        ) from None


def _claim(fd: int, path: Path, key: str, shown: str) -> None:
    """Refuses a lock file holding anything but a lock record, then writes ours.

    A record there is a dead owner's (we hold the ``flock``, and an owner that releases removes the file):
    killed, or its machine gone. Its lock is taken over with one line saying whose it was.
    """
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
        handle.write(json.dumps({"format": _LOCK_FORMAT, **owner_record()}) + "\n")


def acquire(target: Path, key: str, shown: str, wait: bool = False) -> None:
    """Takes the exclusive lock of ``target`` (its parent must exist), or refuses: another process has it.

    With ``wait`` it waits for the other process instead (one line says for whom), e.g. for the node that
    fills a shared cache.
    """
    path = lock_path(target)
    with _registry:
        if path in _held:
            _held[path][1] += 1
            return
        while True:
            fd = _open_lock(path, key, shown)
            try:
                if fcntl is None:
                    raise OSError(errno.ENOSYS, "no flock on this platform")
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if wait:
                    print(f"mlm_adapt: waiting for {shown}{_holder(path)}", flush=True)
                    fcntl.flock(fd, fcntl.LOCK_EX)
                else:
                    os.close(fd)
                    raise MLMAdaptError(
                        f"{key}: {shown} is being written by another mlm_adapt process{_holder(path)}; wait "
                        "for it to finish or choose another directory"
                    ) from None
            except OSError as exc:
                os.close(fd)
                if exc.errno not in _UNSUPPORTED:
                    raise
                warnings.warn(
                    f"{path.parent} does not support file locks; writing {shown} unlocked", stacklevel=2
                )
                _held[path] = [-1, 1]
                return
            # Locked; but a file removed (by a holder releasing) or replaced meanwhile locks nothing.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
            except FileNotFoundError:
                same = False
            if same:
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
        fd = entry[0]
        if fd < 0:
            return
        # Unlink while still locked: a waiter that opened this inode re-checks it and retries.
        with contextlib.suppress(OSError):
            if os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False)):
                os.unlink(path)
        os.close(fd)


@contextlib.contextmanager
def locked(target: Path, key: str, shown: str, wait: bool = False) -> Iterator[None]:
    """Holds the exclusive lock of ``target`` for the ``with`` block (``wait``: see :func:`acquire`)."""
    acquire(target, key, shown, wait)
    try:
        yield
    finally:
        release(target)


def try_lock_file(fd: int) -> bool:
    """Whether the lock on an open file could be taken now (its holder, if any, is gone); keeps it."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return False  # liveness unknown: treat as alive
        raise
    return True
