"""Exclusive locks on output paths, and the staging directories outputs are written in.

Locks: ``filelock`` on ``.<name>.lock`` beside the real output (two spellings of a path share it), and on
:data:`RUN_LOCK` in a run's root directory for the whole of ``fit``. The lock file holds :data:`LOCK_RECORD`
and a line naming its holder (pid, host, since when), so one that a killed writer left is recognisably
ours: it is taken over and removed on release; a live holder is named in the refusal. Any other file at
that name is the user's: refused, never written or removed. Removing it while held is safe because
``filelock`` drops a lock it took on a file no longer linked (a waiter that opened the old file retries on
the new one). A forked worker does not hold its parent's locks (``filelock`` closes their descriptors in
the child), so a worker outliving its killed parent keeps nothing locked.

Staging: an output is written in ``.<name>.staging-<token>/new`` beside its target (one filesystem: the
publishing rename is atomic); a directory output being replaced waits in ``old``. The marker
:data:`STAGING_MARKER` names the target and token and is locked by its writer for the directory's life. A
leftover is deleted only when its marker proves it ours and its lock can be taken (the kernel drops a killed
writer's): a user's ``.export.staging-mynotes/`` is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from mlm_adapt.errors import MLMAdaptError

STAGING_MARKER = ".mlm_adapt-staging.json"
LOCK_RECORD = b"mlm_adapt lock\n"
RUN_LOCK = ".mlm_adapt-run.lock"
_STAGING_FORMAT = "mlm_adapt staging"


def lock_path(target: Path) -> Path:
    """The lock file of a (resolved) output path."""
    return target.parent / f".{target.name}.lock"


def _is_foreign(path: Path) -> bool:
    """Whether a file other than an mlm_adapt lock file stands at ``path``. An empty one is a lock being
    born: filelock creates it, and the holder writes :data:`LOCK_RECORD` into it under the lock (``_mark``);
    one that vanishes while read was a holder's, removed at its release."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return True
        content = path.read_bytes()
    except FileNotFoundError:
        return False
    return content != b"" and not content.startswith(LOCK_RECORD)


def _mark(fd: int) -> None:
    since = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    holder = f"pid {os.getpid()} on {socket.gethostname()}, since {since}\n".encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, LOCK_RECORD + holder, 0)


def _holder(path: Path) -> str:
    """`` (pid 4242 on node1, since …)``: who holds the lock at ``path``, as it wrote; empty if unknown."""
    try:
        content = path.read_bytes()
    except OSError:
        return ""
    holder = content.removeprefix(LOCK_RECORD).decode("utf-8", "replace").strip()
    return f" ({holder})" if content.startswith(LOCK_RECORD) and holder else ""


@contextlib.contextmanager
def locked(
    target: Path, key: str, shown: str, wait: bool = False, lock_file: Path | None = None
) -> Iterator[None]:
    """Holds the exclusive lock of ``target`` (whose parent must exist) for the ``with`` block, or refuses
    in one line naming the holder; with ``wait``, waits for the holder instead (one line says so), e.g. the
    node filling a shared cache. Re-entrant within a process. ``lock_file``: another lock file than
    ``.<name>.lock`` beside ``target``."""
    path = lock_file or lock_path(target)
    if _is_foreign(path):
        raise MLMAdaptError(
            f"{key}: {path} exists and is not an mlm_adapt lock file; move it away to write {shown}"
        )
    lock = FileLock(path, is_singleton=True, on_acquired=_mark)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        if not wait:
            raise MLMAdaptError(
                f"{key}: {shown} is being written by another mlm_adapt process{_holder(path)}; wait for it "
                "to finish or choose another directory"
            ) from None
        print(f"mlm_adapt: waiting for {shown} (another mlm_adapt process holds it)", flush=True)
        lock.acquire()
    try:
        yield
    finally:
        if lock.lock_counter == 1:  # the outermost holder: removed while held, so a waiter retries anew
            with contextlib.suppress(OSError):
                os.unlink(path)
        lock.release()


def run_root_locked(root: Path) -> contextlib.AbstractContextManager[None]:
    """Holds :data:`RUN_LOCK` in the run root ``root`` (created if missing): one ``fit`` writes a run's
    logger versions, checkpoints and config at a time. A killed holder's lock does not block (the kernel
    drops it with the process)."""
    root.mkdir(parents=True, exist_ok=True)
    return locked(root, "trainer.default_root_dir", f"the run root {root}", lock_file=root / RUN_LOCK)


@dataclass
class Staging:
    """A staging directory of this process: its path and its marker's held lock."""

    path: Path
    marker_lock: FileLock

    @property
    def payload(self) -> Path:  # the new output
        return self.path / "new"

    @property
    def backup(self) -> Path:  # an earlier directory output, while it is replaced
        return self.path / "old"

    def remove(self) -> None:
        """Deletes the staging directory (and whatever it still holds) and drops its lock."""
        shutil.rmtree(self.path, ignore_errors=True)
        self.marker_lock.release(force=True)


def _staging_prefix(target: Path) -> str:
    return f".{target.name}.staging-"


def create_staging(target: Path) -> Staging:
    """A fresh staging directory for the (resolved) ``target``, marked and locked as this process's."""
    path = Path(tempfile.mkdtemp(prefix=_staging_prefix(target), dir=target.parent))
    token = path.name.removeprefix(_staging_prefix(target))
    record = {"format": _STAGING_FORMAT, "target": target.name, "token": token}
    try:
        (path / STAGING_MARKER).write_text(json.dumps(record) + "\n", encoding="utf-8")
        lock = FileLock(path / STAGING_MARKER)
        lock.acquire()  # only we know the name yet
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return Staging(path, lock)


def _is_dead_staging(entry: Path, target: Path) -> bool:
    """Whether ``entry`` is a staging directory of ``target`` by its marker and its writer is gone."""
    marker = entry / STAGING_MARKER
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    token = entry.name.removeprefix(_staging_prefix(target))
    if record != {"format": _STAGING_FORMAT, "target": target.name, "token": token} or entry.is_symlink():
        return False
    try:
        with FileLock(marker, blocking=False):
            return True
    except (Timeout, OSError):
        return False


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
