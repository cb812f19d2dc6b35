"""The help of ``fit``, ``validate`` and ``test``, kept on disk once built, so that it answers at once.

LightningCLI builds these commands' parser from the Trainer's, the model's and the data module's
signatures: the whole training stack (``import lightning`` alone is most of 10 s on 2 cores). Their help
text depends only on the installed code, so the first ``COMMAND --help`` renders it as usual and keeps it
under a key of everything it depends on: the content of mlm_adapt's own source files, the versions of the
packages whose signatures and classes it lists, the Python version and the terminal width it was formatted
for. Any change is a new key, so a stale help is never shown. Only a bare ``COMMAND --help`` (or ``-h``) is
cached: with ``--config`` the help shows that file's values as defaults.

The cache lives in ``$MLM_ADAPT_HELP_CACHE`` (empty: no cache), else ``$XDG_CACHE_HOME/mlm_adapt/help`` or
``~/.cache/mlm_adapt/help``. A file is written under a unique name and renamed into place, so two commands
writing at once, or one interrupted, never leave half a help to the next.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import sys
from collections.abc import Callable, Collection
from importlib import metadata
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
# Whose signatures, docstrings and classes the help lists (Trainer, callbacks, loggers, optimizers, ...).
DISTRIBUTIONS = (
    "lightning",
    "jsonargparse",
    "torch",
    "transformers",
    "torchmetrics",
    "datasets",
    "docstring-parser",
)
HELP_FLAGS = ("--help", "-h")
ENV = "MLM_ADAPT_HELP_CACHE"


def cacheable(args: list[str], commands: Collection[str]) -> bool:
    """Whether ``args`` asks for nothing but a trainer command's help."""
    return len(args) == 2 and args[0] in commands and args[1] in HELP_FLAGS


def cache_dir() -> Path | None:
    """Where helps are kept, or ``None`` (caching turned off with an empty ``MLM_ADAPT_HELP_CACHE``)."""
    configured = os.environ.get(ENV)
    if configured is not None:
        return Path(configured) if configured else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mlm_adapt" / "help"


def help_key(command: str) -> str:
    """A digest of everything the command's help text depends on."""
    digest = hashlib.sha256(f"{command}\0{sys.version}\0{shutil.get_terminal_size().columns}".encode())
    for name in DISTRIBUTIONS:
        try:
            digest.update(f"\0{name}={metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"\0{name}=-".encode())
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(b"\0" + path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:32]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _store(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError:  # a full or read-only disk: the help was shown, only not kept
        with contextlib.suppress(OSError):
            partial.unlink()


def cached_help(command: str, render: Callable[[], object]) -> None:
    """Prints ``command``'s help from the cache, or renders it with ``render`` (which prints it and exits
    0, as argparse does) and keeps it; exits 0 either way."""
    directory = cache_dir()
    path = directory / f"{command}-{help_key(command)}.txt" if directory is not None else None
    text = _read(path) if path is not None else None
    if text is None:
        buffer = io.StringIO()
        try:
            with contextlib.redirect_stdout(buffer):
                render()
        except SystemExit as exc:
            if exc.code not in (0, None):
                sys.stdout.write(buffer.getvalue())
                raise
        text = buffer.getvalue()
        if path is not None and text:
            _store(path, text)
    sys.stdout.write(text)
    sys.stdout.flush()
    sys.exit(0)
