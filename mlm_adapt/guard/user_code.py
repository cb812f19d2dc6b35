"""User code (a class-path segmenter) runs where it cannot end or move the command silently.

Two things user code can do that no exception handler sees:

- **End the process**: ``os._exit(0)`` (or a library's C ``exit``) skips every ``finally``, so a command
  would end with status 0, nothing published, its lock and staging directory left behind.
  :func:`ends_process` runs a call once in a forked copy of the process (the *probe*) and says whether
  it ended that copy with a status where it should have returned or raised; the caller refuses the user
  code in one line before calling it itself. The probe runs the first call in each process only: a later
  call that ends the process is not caught there (in ``prepare``'s and ``fit``'s map workers it is: a
  worker that ends without a word fails the command in one line, see :mod:`mlm_adapt.data.preprocess`).
  See docs/segmenters.md.
- **Move the command**: ``os.chdir`` would move every relative path resolved afterwards (the cache,
  logs, checkpoints, the export). :func:`same_directory` restores the working directory after each call
  and refuses the call in one line.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator

_RETURNED = b"returned"


def ends_process(call: Callable[[], object]) -> str | None:
    """Runs ``call()`` in a forked copy of this process; ``"called os._exit(N)"`` when it ended the copy
    with a status instead of returning or raising, else ``None`` (the caller's own call then returns or
    reports the error). A copy killed by a signal is ``None`` too: a stop, the OOM killer or a crash is no
    status the command could report as success, and the real call meets it again (a crash) or the command
    handles it as it does everywhere (a stop). The copy's effects (files aside) stay in the copy."""
    reader, writer = os.pipe()
    pid = os.fork()  # the forked child drops the command's locks and dies with it (mlm_adapt.guard.locks)
    if pid == 0:  # the probe: whatever the call does, only this process ends
        try:
            os.close(reader)
            with contextlib.suppress(BaseException):
                call()
            os.write(writer, _RETURNED)
        finally:
            os._exit(0)
    os.close(writer)
    running: int | None = pid
    try:
        with os.fdopen(reader, "rb") as pipe:
            said = pipe.read()
        _, status = os.waitpid(pid, 0)
        running = None
    finally:
        if running is not None:  # stopped (Ctrl-C) while the probe ran: it goes too
            with contextlib.suppress(OSError):
                os.kill(running, signal.SIGKILL)
                os.waitpid(running, 0)
    code = os.waitstatus_to_exitcode(status)
    return None if said == _RETURNED or code < 0 else f"called os._exit({code})"


@contextlib.contextmanager
def same_directory(refusal: Callable[[str], BaseException]) -> Iterator[None]:
    """Runs the block (a call of user code); if it changed the working directory, changes it back and
    raises ``refusal("changed the working directory to DIR")``."""
    before = os.getcwd()
    try:
        yield
    finally:
        try:
            after = os.getcwd()
        except OSError:  # it moved into a directory that is gone now
            after = "a removed directory"
        if after != before:
            os.chdir(before)
    if after != before:
        raise refusal(f"changed the working directory to {after}")
