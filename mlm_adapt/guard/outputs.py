"""Every file the tool writes goes through here: exports, prepared shards, vocabularies, plots, checkpoints.

An :class:`Output` names the path, its option and the run's inputs. The rules, checked by
:func:`check_output` before any work and again under the lock when writing:

- Symlinks: the real path (every component resolved) is checked, locked and replaced, so a link the user
  pointed at it keeps pointing at the new output; a dangling link or a loop is refused. Checkpoint files
  (``follow_link=False``) replace a link rather than write through it: Lightning's ``save_last: link``.
- An output never is, contains or lies inside an input of the run (a glob: what it matches now); a
  directory output never is or contains the current directory or a run directory. Writability is checked
  up front.
- Outputs are written under their lock in a staging directory beside them (:mod:`mlm_adapt.guard.locks`).
  A directory output is published by renames and replaces only an earlier export (holding :data:`MARKER`
  and nothing else) with ``overwrite``, or its writer's own stale output (``replaces``: a prepared part
  of a changed corpus), decided again at publish time. A file output replaces its target
  in one ``os.replace``, keeping its mode. Everything gets the umask's mode (safetensors and ``mkstemp``
  write 0600) and is fsynced.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlm_adapt.errors import MLMAdaptError, is_disk_full
from mlm_adapt.guard.locks import Staging, clean_leftovers, create_staging, locked

MARKER = ".mlm_adapt-export.json"
_MARKER_FORMAT = "mlm_adapt export"
_GLOB_CHARS = "*?["


def _finish(path: Path, file_mode: int | None = None) -> None:
    """Gives files ``0666 & ~umask`` (a single file: ``file_mode`` if given), directories ``0777 & ~umask``;
    flushes the files to disk."""
    mask = os.umask(0o022)  # read, then set back
    os.umask(mask)
    top_mode = 0o666 & ~mask if file_mode is None else file_mode
    entries = [(path, top_mode if path.is_file() else 0o777 & ~mask)]
    for root, dirs, files in os.walk(path):  # nothing for a file
        entries += [(Path(root, d), 0o777 & ~mask) for d in dirs]
        entries += [(Path(root, f), 0o666 & ~mask) for f in files]
    for entry, mode in entries:
        if not entry.is_symlink():
            os.chmod(entry, mode)
            if entry.is_file():
                _fsync(entry)


def _fsync(path: Path) -> None:
    """Flushes a file, or a directory's entries (renames in it), to disk where the platform allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --- path rules --------------------------------------------------------------------------------------------


def _absolute(given: str | Path) -> Path:
    path = Path(given).expanduser()
    return path if path.is_absolute() else Path.cwd() / path


def resolve(given: str | Path, key: str, follow_link: bool = True) -> Path:
    """The real path ``given`` (named by option ``key``) names, refusing a dangling link or a link loop in any
    component; without ``follow_link``, the last component is not resolved."""
    absolute = _absolute(given)
    prefix = Path(absolute.anchor)
    for part in absolute.parts[1:]:
        prefix = prefix / part
        if os.path.islink(prefix) and not os.path.exists(prefix):
            if prefix == absolute and not follow_link:
                break
            where = "" if prefix == absolute else f": {prefix}"
            raise MLMAdaptError(
                f"{key}: {given}{where} is a symbolic link to {os.readlink(prefix)}, which does not exist "
                "(or loops); create its target or remove the link"
            )
        if not os.path.lexists(prefix):
            break  # the rest is to be created
    if not follow_link:
        return Path(os.path.realpath(absolute.parent)) / absolute.name
    return Path(os.path.realpath(absolute))


def shown(given: str | Path, real: Path) -> str:
    """The user's path, followed by the real one when a link or ``..`` made them differ."""
    return str(given) if os.path.normpath(_absolute(given)) == str(real) else f"{given} (-> {real})"


def _conflict(real: Path, found: Path, given: str, key: str) -> str | None:
    """How the output ``real`` collides with the input ``given`` (real path ``found``), if it does."""
    if real == found:
        return f"is the input {given} ({key})"
    if found in real.parents:
        return f"lies inside the input {given} ({key})"
    if real in found.parents:
        return f"contains the input {given} ({key})"
    return None


def _input_conflict(real: Path, given: str, key: str) -> str | None:
    """How the output ``real`` collides with the input path or glob ``given`` (and what it matches now)."""
    path = Path(given).expanduser()
    if not any(c in given for c in _GLOB_CHARS):
        return _conflict(real, Path(os.path.realpath(path)), given, key) if os.path.lexists(path) else None
    cut = next(i for i, p in enumerate(path.parts) if any(c in p for c in _GLOB_CHARS))
    root = Path(os.path.realpath(Path(*path.parts[:cut]) if cut else Path(".")))
    if root.is_relative_to(real):
        return f"contains the input {given} ({key})"
    matches = glob.glob(str(path), recursive=True)
    return next(filter(None, (_conflict(real, Path(os.path.realpath(m)), m, key) for m in matches)), None)


def _check_rules(output: Output) -> Path:
    """The output's real path, after refusing what the path rules forbid (see the module docstring)."""
    real, given, key = output.resolve(), output.path, output.key
    name = shown(given, real)
    protected = []  # what a directory output must not be or contain, for messages: (path, what, note, e.g.)
    if output.directory:
        protected.append((Path(os.path.realpath(Path.cwd())), "the current directory", "", "./export"))
        for run in (Path(os.path.realpath(_absolute(d))) for d in output.run_dirs):
            protected.append((run, "the run directory", " (checkpoints and logs)", run / "export"))
    for directory, what, note, example in protected:
        if directory.is_relative_to(real):
            what = f"is {what}" if real == directory else f"contains {what} {directory}"
            raise MLMAdaptError(f"{key}: {given} {what}{note}; give a directory of its own, e.g. {example}")
    for input_key, items in output.inputs.items():
        for item in filter(None, items):
            what = _input_conflict(real, str(item), input_key)
            if what:
                raise MLMAdaptError(
                    f"{key}: {name} {what}; write it elsewhere; outputs never replace or nest in inputs"
                )
    if os.path.lexists(real):
        mode = os.stat(real, follow_symlinks=False).st_mode
        if output.directory and not stat.S_ISDIR(mode):
            raise MLMAdaptError(f"{key}: {name} is a file; give a directory")
        if not output.directory and stat.S_ISDIR(mode):
            raise MLMAdaptError(f"{key}: {name} is a directory; give a file path")
        if not output.directory and not stat.S_ISREG(mode) and not stat.S_ISLNK(mode):
            raise MLMAdaptError(f"{key}: {name} is not a regular file; give a file path")
        if output.directory and os.path.ismount(real):
            raise MLMAdaptError(
                f"{key}: {name} is a mount point, which an export cannot replace; give a directory inside "
                f"it, e.g. {real / 'model'}"
            )
        # A directory output is moved aside as a whole; a file the user made read-only means "keep this".
        if not stat.S_ISLNK(mode) and not os.access(real, os.W_OK):
            raise MLMAdaptError(f"{key}: {name} is read-only; make it writable or write elsewhere")
    ancestor = real.parent
    while not os.path.lexists(ancestor):  # missing parents are created
        ancestor = ancestor.parent
    if not os.path.isdir(ancestor):
        raise MLMAdaptError(f"{key}: cannot write {name}: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise MLMAdaptError(
            f"{key}: cannot write {name}: {ancestor} is read-only (or not writable by you); write elsewhere"
        )
    return real


# --- outputs -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Output:
    """A path the tool is about to write, and the rules it is written under.

    Args:
        path: The path as the user gave it.
        key: The option that named it (``--output_dir``, ``export.output_dir``), for messages.
        directory: A directory output (an export) rather than a single file.
        overwrite: A directory output may replace an earlier export (files are always replaced).
        inputs: Input paths or globs of the run, by the option that named them.
        run_dirs: Directories of the run (logs, checkpoints) a directory output must not be or contain.
        follow_link: Write through a symlink at ``path`` itself (``False`` for checkpoint files).
        replaces: A directory output may replace a directory holding this file: a complete earlier output
            of the same writer (a prepared part's ``manifest.json``) that the caller checked and found stale.
    """

    path: str | Path
    key: str = "--output_dir"
    directory: bool = True
    overwrite: bool = False
    inputs: Mapping[str, Sequence[str | Path | None]] = field(default_factory=dict)
    run_dirs: Sequence[str | Path] = ()
    follow_link: bool = True
    replaces: str | None = None

    def resolve(self) -> Path:
        """The real path written (see the symlink policy)."""
        return resolve(self.path, self.key, self.follow_link)


def write_marker(directory: str | Path) -> None:
    """Writes :data:`MARKER` into ``directory``, listing every entry it holds (the export's own files):
    last, after the files were checked, so a directory with a valid marker is a complete export."""
    files = sorted(p.name for p in Path(directory).iterdir() if p.name != MARKER)
    payload = {"format": _MARKER_FORMAT, "version": 1, "files": files}
    (Path(directory) / MARKER).write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")


def _listed(directory: str | Path) -> tuple[set[str], set[str]] | None:
    """The entries ``directory``'s marker lists and those it holds (``None``: no valid marker)."""
    try:
        payload = json.loads((Path(directory) / MARKER).read_text(encoding="utf-8"))
        listed = payload["files"] if payload["format"] == _MARKER_FORMAT else None
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not isinstance(listed, list):
        return None
    return {str(f) for f in listed}, {p.name for p in Path(directory).iterdir()} - {MARKER}


def is_complete_export(directory: str | Path) -> bool:
    """A directory with a valid marker whose listed entries are all present and that holds nothing else."""
    entries = _listed(directory)
    return entries is not None and entries[0] == entries[1]


def _refuse_unreplaceable(output: Output, real: Path, at_publish: bool = False) -> None:
    """Refuses a non-empty directory unless it is an earlier export that ``overwrite`` may replace."""
    if not real.is_dir() or not any(real.iterdir()):
        return
    if output.replaces and (real / output.replaces).is_file():
        return  # the caller's own stale output, checked by it
    given, key, entries = output.path, output.key, _listed(real)
    foreign = None if entries is None else sorted(entries[1] - entries[0])  # None: not an export at all
    if at_publish and not (output.overwrite and foreign == []):
        raise MLMAdaptError(
            f"{key}: {shown(given, real)} was written by another process while this command ran; nothing was "
            "replaced (choose another directory, or pass overwrite to replace an earlier export)"
        )
    if not output.overwrite:
        hint = "pass overwrite to replace the earlier export" if foreign == [] else "choose another directory"
        raise MLMAdaptError(f"{key}: {given} is not empty; {hint} (overwrite: --overwrite)")
    if foreign is None:
        raise MLMAdaptError(
            f"{key}: {given} is not an mlm_adapt export (no {MARKER}); overwrite replaces only an "
            "earlier export: choose another directory or empty this one yourself"
        )
    if foreign:
        raise MLMAdaptError(
            f"{key}: {given} holds {', '.join(foreign[:3])}, which no export wrote; overwrite replaces "
            "only an export's own files: move it away or choose another directory"
        )


def check_output(output: Output) -> Path:
    """Refuses, with one line and before any work, an output that must not or cannot be written; returns the
    real path. A directory output whose parent exists also gets what a killed writer left repaired (under
    the lock) and the ``overwrite`` rule applied to what is there now."""
    real = _check_rules(output)
    if output.directory and real.parent.is_dir():
        with locked(real, output.key, shown(output.path, real)):
            clean_leftovers(real)
            _refuse_unreplaceable(output, real)
    return real


def refuse_same_outputs(outputs: Iterable[Output]) -> None:
    """Refuses two outputs of one command that are the same file (``--output_dict`` = ``--output_tokens``)."""
    seen: dict[Path, Output] = {}
    for output in outputs:
        real = output.resolve()
        if real in seen:
            raise MLMAdaptError(
                f"{output.key}: {output.path} is also {seen[real].key}; give each output its own path"
            )
        seen[real] = output


@contextlib.contextmanager
def _staged(real: Path) -> Iterator[Staging]:
    """A staging directory for ``real``, removed afterwards; a full disk is reported on the user's path."""
    clean_leftovers(real)
    staging = create_staging(real)
    try:
        yield staging
    except Exception as exc:
        if is_disk_full(exc):  # named by the user's path, however the writer worded it
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(real)) from exc
        raise
    finally:
        staging.remove()


@contextlib.contextmanager
def write_directory(
    output: Output,
    publishing: contextlib.AbstractContextManager[object] | None = None,
    proof: str | None = None,
) -> Iterator[Path]:
    """Yields an empty staging directory to write ``output`` into (under its lock, after the rules are
    re-checked and killed writers' leftovers repaired); publishes it when the block succeeds.

    ``publishing`` is entered around the publication (a progress phase: fsyncing hundreds of MB takes
    seconds). ``proof`` is the file the writer puts in to mark the directory complete (a prepared
    directory's ``manifest.json``); without one, the export marker is written. Publishing is one rename
    over an absent or empty target; an earlier export (``overwrite``, re-checked now) first moves to
    ``old`` in the staging directory. Whatever happens, the staging directory is gone afterwards.
    """
    real = _check_rules(output)
    real.parent.mkdir(parents=True, exist_ok=True)
    with locked(real, output.key, shown(output.path, real)), _staged(real) as staging:
        _refuse_unreplaceable(output, real)
        staging.payload.mkdir(mode=0o777)
        yield staging.payload
        with publishing or contextlib.nullcontext():
            if proof is None:
                write_marker(staging.payload)
            elif not (staging.payload / proof).is_file():
                raise MLMAdaptError(
                    f"{output.key}: {shown(output.path, real)}: {proof} was not written, so nothing was "
                    "published; run the same command again"
                )
            _finish(staging.payload)
            _refuse_unreplaceable(output, real, at_publish=True)
            replacing = real.is_dir() and any(real.iterdir())
            if replacing:
                os.rename(real, staging.backup)
            try:
                os.rename(staging.payload, real)  # replaces an absent or empty directory in one step
            except BaseException:
                if replacing:  # the earlier export goes back before the staging directory is removed
                    os.rename(staging.backup, real)
                raise
            _fsync(real.parent)


@contextlib.contextmanager
def write_file(output: Output) -> Iterator[Path]:
    """Yields a staging path for ``output``'s file; when the block succeeds, it gets the replaced file's mode
    (else the umask's), is fsynced and moved over the target (readers see the old file or the new one)."""
    real = _check_rules(output)
    real.parent.mkdir(parents=True, exist_ok=True)
    with _staged(real) as staging:
        yield staging.payload
        mode = None
        if real.is_file() and not (real.is_symlink() and not output.follow_link):
            mode = real.stat().st_mode & 0o7777
        _finish(staging.payload, file_mode=mode)
        os.replace(staging.payload, real)
        _fsync(real.parent)


def write_text(output: Output, text: str) -> Path:
    """Writes ``text`` (UTF-8) as the file ``output``; returns the real path written."""
    with write_file(output) as path:
        path.write_text(text, encoding="utf-8")
    return output.resolve()
