"""User-facing errors: one line that names the file or config key at fault and how to fix it.

Also the CLI's translation of library exceptions that are the user's doing (a Lightning misconfiguration, a
full disk, a missing file) into that one line. This module imports neither torch nor Lightning (every layer
imports it): their exception classes are recognised by name.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
from collections.abc import Iterator
from types import TracebackType

DEBUG_ENV = "MLM_ADAPT_DEBUG"
DEBUG_HINT = f"rerun with --debug or {DEBUG_ENV}=1 for the traceback"

# Exception classes (by name, anywhere in the MRO) whose message is meant for the user as it stands.
_CONFIG_ERRORS = ("MisconfigurationException",)
# Lightning checks its arguments with these too (a strategy that needs a GPU, a val_check_interval longer
# than the epoch, a --ckpt_path that does not exist): user errors when Lightning's own code raised them.
_LIGHTNING_ARGUMENT_ERRORS = (ValueError, FileNotFoundError)
_LIGHTNING_PACKAGES = ("lightning", "lightning_fabric", "pytorch_lightning")
_RESOURCE_ERRORS = ("OutOfMemoryError",)
# Local variables that name the file being written, most specific first: what a full disk is reported on
# when the writer (torch.save, fsspec, safetensors, pyarrow) does not say it.
_PATH_LOCALS = ("filepath", "filename", "path", "target", "save_directory", "file", "f", "fname")


class MLMAdaptError(Exception):
    """A problem with the user's configuration or data.

    The CLI prints the message alone (no traceback) and exits with status 2, so the message must say which
    file or config key is wrong and what to do about it.
    """


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, as the CLI's SIGINT handler raises it.

    Any other ``KeyboardInterrupt`` (or ``SystemExit``) that reaches a boundary of user code -- a segmenter,
    a library it wraps -- was raised by that code: a failure of it, reported as such, never a stop.
    """


class Stopped(SystemExit):
    """The exit a stop signal raises outside training (SIGTERM, SIGUSR1): ``128 + signal``.

    Like :class:`Interrupted`, it passes every boundary of user code as the stop it is.
    """


def raised(exc: BaseException) -> str:
    """What code did, for a message: ``called exit(0)``, ``raised KeyboardInterrupt``, ``raised X: msg``."""
    if isinstance(exc, SystemExit):
        return f"called exit({exc.code!r})"
    message = _first_line(str(exc))
    return f"raised {type(exc).__name__}" + (f": {message}" if message else "")


@contextlib.contextmanager
def user_code(who: str, hint: str) -> Iterator[None]:
    """The boundary around user code (a class-path callback's hook, a task type's reader).

    A ``SystemExit``, ``KeyboardInterrupt`` or any other ``BaseException`` it raises is a failure of that
    code, never a stop or a success: one :class:`MLMAdaptError` "``who`` called exit(0); ``hint``" (status
    2). A stop signal's own exceptions (:class:`Interrupted`, :class:`Stopped`) pass as they are, and so
    does every ``Exception`` (an error of the user's code keeps its traceback: that is its bug report).
    """
    try:
        yield
    except (Exception, Interrupted, Stopped, GeneratorExit):
        raise
    except BaseException as exc:
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
    """Whether ``exc`` or an exception it was raised from is ENOSPC (however the library wrapped it).

    torch's ``inline_container.cc`` enforce failure, for one, carries the ``OSError`` only as its context.
    """
    for item in _chain(exc):
        if isinstance(item, OSError) and item.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(item):
            return True
    return False


def _as_path(value: object) -> str | None:
    if isinstance(value, os.PathLike):
        return os.fspath(value)  # type: ignore[return-value]
    if isinstance(value, str) and value and not value.startswith("<"):
        return value
    name = getattr(value, "name", None)  # an open file
    return name if isinstance(name, str) and not name.startswith("<") else None


def written_path(exc: BaseException) -> str | None:
    """The file being written when ``exc`` happened: its ``filename``, else the innermost frame naming one."""
    for item in _chain(exc):
        if isinstance(item, OSError) and item.filename:
            return os.fspath(item.filename)
    frames: list[TracebackType] = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    for tb in reversed(frames):
        local_vars = tb.tb_frame.f_locals
        for name in _PATH_LOCALS:
            path = _as_path(local_vars.get(name))
            if path is not None:
                return path
    return None


def _raised_by_lightning(exc: BaseException) -> bool:
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    module = str(tb.tb_frame.f_globals.get("__name__", ""))
    return module.split(".")[0] in _LIGHTNING_PACKAGES


def _type_names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


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
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return text.strip()


# A parser error is folded onto one line; jsonargparse's nested class errors can run to dozens of lines.
MAX_PARSER_MESSAGE = 400


def parser_message(exc: BaseException) -> str | None:
    """A command-line parser error (argparse/jsonargparse ``ArgumentError``) as one line, else ``None``."""
    if not isinstance(exc, argparse.ArgumentError):
        return None
    text = re.sub(r"\s+", " ", str(exc)).strip() or "invalid arguments"
    if len(text) > MAX_PARSER_MESSAGE:
        text = text[: MAX_PARSER_MESSAGE - 3].rstrip() + "..."
    return text


def user_message(exc: BaseException) -> tuple[str, int] | None:
    """The one line (and exit status) the CLI prints for ``exc``, or ``None`` if it is a bug (traceback).

    ``MLMAdaptError``, Lightning's ``MisconfigurationException`` and the ``ValueError``/``FileNotFoundError``
    Lightning raises about its arguments are configuration errors (status 2); a full disk, out of memory
    and a file the system refused to open or write are about the machine (status 1). Anything else is not
    the user's doing and keeps its traceback.
    """
    names = _type_names(exc)
    parsed = parser_message(exc)
    if parsed is not None:
        return parsed, 2
    if isinstance(exc, MLMAdaptError):
        return _first_line(str(exc)), 2
    if is_disk_full(exc):
        path = written_path(exc)
        where = f" writing {path}" if path else ""
        return f"no space left on device{where}; free some space there or write elsewhere", 1
    if names & set(_CONFIG_ERRORS):
        return _first_line(str(exc)), 2
    if isinstance(exc, _LIGHTNING_ARGUMENT_ERRORS) and _raised_by_lightning(exc):
        return _first_line(str(exc)), 2
    if names & set(_RESOURCE_ERRORS):
        return f"{_first_line(str(exc))} (lower data.batch_size or data.max_seq_length)", 1
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.strerror}: {os.fspath(exc.filename)}", 1
    return None


def looks_like_path(name: str) -> bool:
    """Whether a model name is meant as a local path rather than a Hub id (``NAME`` or ``ORG/NAME``)."""
    return name.startswith((".", "/", "~", "\\")) or name.count("/") > 1 or "\\" in name or ":" in name


def check_model_path(name: str, key: str) -> None:
    """Refuses a local model path that does not exist, before ``from_pretrained`` tries the Hub with it.

    Args:
        name: A Hub id or a local directory.
        key: The option that named it, for the message.
    """
    path = os.path.expanduser(name)
    if looks_like_path(name) and not os.path.exists(path):
        raise MLMAdaptError(f"{key}: {name} does not exist; check the path (a save_pretrained directory)")
