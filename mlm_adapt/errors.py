"""User-facing errors: one line naming the file or config key at fault and how to fix it, also for library
exceptions that are the user's doing (a Lightning misconfiguration, a full disk, a missing file); and the
stops: the signal received (:data:`STOP`), its handlers outside training and the exceptions they raise.
Every layer imports this module, so it imports neither torch nor Lightning: their exceptions are known by
name.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

DEBUG_ENV = "MLM_ADAPT_DEBUG"
DEBUG_HINT = f"rerun with --debug or {DEBUG_ENV}=1 for the traceback"


class MLMAdaptError(Exception):
    """A problem with the user's configuration or data: the CLI prints the message alone and exits with
    status 2, so it must say which file or config key is wrong and what to do about it."""


class Stopped(SystemExit):
    """The exit (``128 + signal``) a stop signal raises outside training (SIGTERM, SIGUSR1)."""


class StopState:
    """The stop signal received by this process (shared by the handlers, the callback and the CLI)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """No signal yet (each command starts so, also several in one process)."""
        self.signum: int | None = None
        self.checkpoint: Path | None = None
        self.step: int | None = None

    @property
    def exit_code(self) -> int:
        """``128 + signal``, as a shell reports a process the signal ended (143 for SIGTERM)."""
        return 128 + int(self.signum or signal.SIGTERM)

    def summary(self, command: str = "fit") -> str:
        """One line for the user: the command, which signal, what was kept, and how to continue."""
        name = signal.Signals(self.signum or signal.SIGTERM).name
        if self.checkpoint is not None and not Path(self.checkpoint).is_file():
            # Never name a checkpoint that is not there (a save that did not write, a file removed since).
            return (
                f"{command} stopped by {name} at step {self.step}, but its checkpoint {self.checkpoint} is "
                "missing; continue from an earlier checkpoint (--ckpt_path) or run the same command again"
            )
        if self.checkpoint is not None:
            return (
                f"{command} stopped by {name}: saved {self.checkpoint} at step {self.step}; continue with "
                "--ckpt_path last (same config)"
            )
        if command == "fit" and self.step is not None:  # Ctrl-C in training: Lightning stopped at once
            return (
                f"fit stopped by {name} at step {self.step}; this stop wrote no checkpoint (SIGTERM writes "
                "one first); run the same command again, or continue from a checkpoint the run saved with "
                "--ckpt_path last"
            )
        if command == "fit":
            return f"fit stopped by {name} outside the training steps; no checkpoint written by this run"
        # Every writer publishes by an atomic rename of a staging directory it removes when stopped.
        return (
            f"{command} stopped by {name}; nothing was published and the inputs are untouched; run the same "
            "command again"
        )


STOP = StopState()


def record_stop(signum: int, _frame: FrameType | None) -> None:
    """The handler during training: records the signal for :class:`mlm_adapt.training.signals.StopOnSignal`
    to act on at the next optimizer step."""
    STOP.signum = STOP.signum or signum


def stop_now(signum: int, _frame: FrameType | None) -> None:
    """The handler outside training (parsing, data preparation, export): no step to finish, so record the
    signal and stop at once, with the same status as during training."""
    record_stop(signum, _frame)
    raise Stopped(STOP.exit_code)


def install_stop_handlers(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGUSR1)) -> None:
    """Makes the stop signals end the process with ``128 + signal`` until training takes them over."""
    if threading.current_thread() is threading.main_thread():
        for signum in signals:
            signal.signal(signum, stop_now)


def raised(exc: BaseException) -> str:
    """What code raised, for a message: ``raised X: msg``."""
    message = _first_line(str(exc))
    return f"raised {type(exc).__name__}" + (f": {message}" if message else "")


@contextlib.contextmanager
def user_code(who: str, hint: str) -> Iterator[None]:
    """Runs user code (a task type's reader) as written: its exception is one :class:`MLMAdaptError`,
    "``who`` raised X: message; ``hint``" (``--debug`` shows the traceback). What else it does to the
    process (an exit, a chdir) is its own."""
    try:
        yield
    except MLMAdaptError:
        raise
    except Exception as exc:
        if debug_enabled():
            raise
        raise MLMAdaptError(f"{who} {raised(exc)}; {hint}") from None


def debug_enabled() -> bool:
    """Whether the CLI shows tracebacks (``--debug`` or ``MLM_ADAPT_DEBUG=1``)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` or an exception it was raised from is ENOSPC, however wrapped (torch's
    ``inline_container.cc`` enforce failure carries the ``OSError`` only as its context)."""
    return any(
        (isinstance(item, OSError) and item.errno == errno.ENOSPC) or "No space left on device" in str(item)
        for item in _chain(exc)
    )


def exception_line(exc: BaseException) -> str:
    """The first non-empty line of ``exc``'s message, else its type's name: what a one-line error quotes."""
    return _first_line(str(exc)) or type(exc).__name__


def _first_line(text: str) -> str:
    # A DataLoader worker re-raises with the worker's whole traceback as the message; its last line is the
    # original "Type: message".
    if "\nOriginal Traceback" in text:
        last = [line for line in text.splitlines() if line.strip()][-1]
        head, sep, rest = last.partition(": ")
        text = rest if sep and " " not in head else last
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


# A parser error is folded onto one line; jsonargparse's nested class errors can run to dozens of lines.
MAX_PARSER_MESSAGE = 400


def parser_message(exc: BaseException) -> str | None:
    """A command-line parser error (argparse/jsonargparse ``ArgumentError``, or the ``OverflowError``
    jsonargparse lets through for a number no float holds) as one line, else ``None``."""
    if isinstance(exc, OverflowError):
        return f"a number on the command line or in the config is too large ({exception_line(exc)})"
    if not isinstance(exc, argparse.ArgumentError):
        return None
    text = re.sub(r"\s+", " ", str(exc)).strip() or "invalid arguments"
    if len(text) > MAX_PARSER_MESSAGE:
        text = text[: MAX_PARSER_MESSAGE - 3].rstrip() + "..."
    return text


def user_message(exc: BaseException) -> tuple[str, int] | None:
    """The one line and exit status the CLI prints for ``exc``: 2 for configuration errors, 1 for the
    machine's (a full disk, out of memory, a file the system refused); ``None`` for a bug (traceback)."""
    names = {cls.__name__ for cls in type(exc).__mro__}  # Lightning and torch classes, known by name
    parsed = parser_message(exc)
    if parsed is not None:
        return parsed, 2
    if isinstance(exc, MLMAdaptError):
        return _first_line(str(exc)), 2
    if is_disk_full(exc):
        # The file, where an error in the chain names one (the outputs module names the user's path).
        path = next(
            (os.fspath(e.filename) for e in _chain(exc) if isinstance(e, OSError) and e.filename), None
        )
        where = f" writing {path}" if path else ""
        return f"no space left on device{where}; free some space there or write elsewhere", 1
    if "MisconfigurationException" in names:
        return _first_line(str(exc)), 2
    if "OutOfMemoryError" in names:
        return f"{_first_line(str(exc))} (lower data.batch_size or data.max_seq_length)", 1
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.strerror}: {os.fspath(exc.filename)}", 1
    return None


def check_checkpoint_path(path: str | os.PathLike, key: str) -> None:
    """Refuses a checkpoint (file or FSDP sharded directory, given as option ``key``) that does not exist:
    light, so that the commands say it before importing their stack."""
    if not os.path.exists(path):
        raise MLMAdaptError(f"{key}: {os.fspath(path)} does not exist; give a .ckpt file the trainer wrote")


def check_model_path(name: str, key: str) -> None:
    """Refuses a local model path (``name``, given as option ``key``) that does not exist, before
    ``from_pretrained`` tries the Hub with it (a Hub id is ``NAME`` or ``ORG/NAME``)."""
    looks_like_path = (
        name.startswith((".", "/", "~", "\\")) or name.count("/") > 1 or "\\" in name or ":" in name
    )
    if looks_like_path and not os.path.exists(os.path.expanduser(name)):
        raise MLMAdaptError(f"{key}: {name} does not exist; check the path (a save_pretrained directory)")
