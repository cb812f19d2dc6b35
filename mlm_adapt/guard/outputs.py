"""Every path the tool writes goes through here: exports, vocabulary files, plots, checkpoints.

An :class:`Output` names the path, the option it came from and the run's inputs. The rules, checked by
:func:`check_output` before any work and again under the lock when writing:

- Symlinks are resolved deliberately (see :mod:`mlm_adapt.guard.paths`); dangling ones are refused.
- An output never is, contains, lies inside or would be globbed as an input of the run (corpus,
  validation and task files, user dictionary, new-tokens file, base model, checkpoint); a directory output
  never is or contains the current directory or a run directory.
- Writability is checked up front: the kind of what is there, read-only targets and parents, mount points.
- A directory output is written under an exclusive lock (:mod:`mlm_adapt.guard.locks`) in a staging
  directory (:mod:`mlm_adapt.guard.staging`) and published by renames. It replaces only an earlier export
  (a directory holding :data:`MARKER` and nothing else) and only with ``overwrite``, decided again at
  publish time. A file output is written in a staging directory too and replaces its target in one
  ``os.replace`` (a file keeps the mode of the file it replaces).
- Every file and directory gets the umask's mode; staging leftovers are cleaned only when proven ours.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlm_adapt.errors import MLMAdaptError, is_disk_full
from mlm_adapt.guard.locks import locked
from mlm_adapt.guard.paths import check_writable, refuse_inputs, refuse_run_dirs, resolve, shown
from mlm_adapt.guard.staging import (
    Staging,
    apply_umask,
    clean_leftovers,
    create_staging,
    fsync_dir,
    fsync_path,
)

MARKER = ".mlm_adapt-export.json"
_MARKER_FORMAT = "mlm_adapt export"
# What this command published, each with the file that proves it complete (the CLI checks them at exit).
_published: list[tuple[Path, Path]] = []


def record_published(output: Path, proof: Path) -> None:
    """Notes that ``output`` was published; ``proof`` (its manifest or marker) must exist at exit."""
    _published.append((output, proof))


def forget_published() -> None:
    """A new command: nothing published yet."""
    _published.clear()


def missing_published() -> list[tuple[Path, Path]]:
    """What this command published whose proof is not there: a command must not report it as success."""
    return [(output, proof) for output, proof in _published if not proof.is_file()]


@dataclass(frozen=True)
class Output:
    """A path the tool is about to write, and the rules it is written under.

    Args:
        path: The path as the user gave it.
        key: The option that named it (``--output_dir``, ``export.output_dir``), for messages.
        directory: A directory output (an export) rather than a single file.
        overwrite: A directory output may replace an earlier export (files are always replaced).
        inputs: Input paths or globs of the run by the option that named them.
        run_dirs: Directories of the run (logs, checkpoints) a directory output must not be or contain.
        follow_link: Write through a symlink at ``path`` itself (``False`` for checkpoint files).
    """

    path: str | Path
    key: str = "--output_dir"
    directory: bool = True
    overwrite: bool = False
    inputs: Mapping[str, Sequence[str | Path | None]] = field(default_factory=dict)
    run_dirs: Sequence[str | Path] = ()
    follow_link: bool = True

    def resolve(self) -> Path:
        """The real path written (see the symlink policy)."""
        return resolve(self.path, self.key, self.follow_link)

    def shown(self, real: Path) -> str:
        """The user's path (and the real one where they differ), for messages."""
        return shown(self.path, real)


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


def _refuse_unreplaceable(output: Output, real: Path, at_publish: bool = False) -> None:
    """Refuses a non-empty directory unless it is an earlier export that ``overwrite`` may replace."""
    if not real.is_dir() or not any(real.iterdir()):
        return
    given, key = output.path, output.key
    foreign = foreign_entries(real)
    if at_publish and not (output.overwrite and foreign == []):
        raise MLMAdaptError(
            f"{key}: {output.shown(real)} was written by another process while this command ran; nothing "
            "was replaced (choose another directory, or pass overwrite to replace an earlier export)"
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


def _check_rules(output: Output) -> Path:
    real = output.resolve()
    if output.directory:
        refuse_run_dirs(real, output.path, output.key, output.run_dirs)
    refuse_inputs(real, output.path, output.key, output.directory, output.inputs)
    check_writable(real, output.path, output.key, output.directory)
    return real


def check_output(output: Output) -> Path:
    """Refuses, with one line and before any work, an output that must not or cannot be written.

    For a directory output whose parent exists, also repairs what a killed writer left (under the lock)
    and applies the ``overwrite`` rule to what is there now.

    Returns:
        The real path that will be written.
    """
    real = _check_rules(output)
    if output.directory and real.parent.is_dir():
        with locked(real, output.key, output.shown(real)):
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
def hold(output: Output) -> Iterator[Path]:
    """Holds ``output``'s lock (creating its parents) across checks and writes; yields the real path."""
    real = _check_rules(output)
    real.parent.mkdir(parents=True, exist_ok=True)
    with locked(real, output.key, output.shown(real)):
        yield real


def _in_user_terms(exc: BaseException, staging: Staging, real: Path) -> BaseException:
    """The exception with the staging path replaced by the user's (a full disk stays a full disk)."""
    inside = str(staging.payload)
    if isinstance(exc, OSError):
        for attr in ("filename", "filename2"):
            value = getattr(exc, attr, None)
            if value is not None and os.fspath(value).startswith(inside):
                setattr(exc, attr, str(real) + os.fspath(value)[len(inside) :])
        return exc
    if is_disk_full(exc):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(real))
    return exc


@contextlib.contextmanager
def _reported_in_user_terms(staging: Staging, real: Path) -> Iterator[None]:
    """Re-raises an error of the writer's block with the user's path in place of the staging one."""
    try:
        yield
    except BaseException as exc:
        translated = _in_user_terms(exc, staging, real)
        if translated is exc:
            raise
        raise translated from exc


@contextlib.contextmanager
def write_directory(
    output: Output,
    publishing: contextlib.AbstractContextManager[object] | None = None,
    proof: str | None = None,
) -> Iterator[Path]:
    """Yields an empty staging directory to write ``output`` into; publishes it when the block succeeds.

    ``publishing`` is entered around the publication (fsync and renames), e.g. a progress phase: for a
    model of hundreds of MB the fsync alone takes seconds. ``proof`` names the file the writer puts in the
    directory to mark it complete (a prepared directory's ``manifest.json``); without one, the export
    marker is written.

    Under ``output``'s lock: leftovers of killed writers are repaired, the rules re-checked, the staging
    directory created. On success the export marker is written, modes follow the umask, files are
    fsynced, and the staging directory replaces the target: one rename for an absent or empty target;
    for an earlier export (``overwrite``, re-checked now) two renames, target -> ``old`` inside the staging
    directory, staging -> target. Whatever happens, the staging directory is gone afterwards.
    """
    with hold(output) as real:
        clean_leftovers(real)
        _refuse_unreplaceable(output, real)
        staging = create_staging(real)
        try:
            staging.payload.mkdir(mode=0o777)
            with _reported_in_user_terms(staging, real):
                yield staging.payload
            with publishing or contextlib.nullcontext():
                if proof is None:
                    write_marker(staging.payload)
                elif not (staging.payload / proof).is_file():
                    raise MLMAdaptError(
                        f"{output.key}: {output.shown(real)}: {proof} was not written, so nothing was "
                        "published; run the same command again"
                    )
                apply_umask(staging.payload)
                fsync_path(staging.payload)
                _refuse_unreplaceable(output, real, at_publish=True)
                replacing = real.is_dir() and any(real.iterdir())
                if replacing:
                    os.rename(real, staging.backup)
                try:
                    # rename() replaces an absent or empty directory in one step.
                    os.rename(staging.payload, real)
                except BaseException:
                    if replacing:  # the earlier export goes back before the staging directory is removed
                        os.rename(staging.backup, real)
                    raise
                fsync_dir(real.parent)
                record_published(real, real / (proof or MARKER))
        finally:
            staging.remove()


@contextlib.contextmanager
def write_file(output: Output) -> Iterator[Path]:
    """Yields a staging path to write ``output``'s file to; it replaces the target when the block succeeds.

    The rules are checked first; leftovers of killed writers of this file are cleaned. The new file gets
    the mode of the file it replaces (else the umask's), is fsynced and moved over the target by
    ``os.replace``: readers see the old file or the new one, never a part.
    """
    real = _check_rules(output)
    real.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(real)
    staging = create_staging(real)
    try:
        with _reported_in_user_terms(staging, real):
            yield staging.payload
        mode = None
        if real.is_file() and not (real.is_symlink() and not output.follow_link):
            mode = real.stat().st_mode & 0o7777
        apply_umask(staging.payload, file_mode=mode)
        fsync_path(staging.payload)
        os.replace(staging.payload, real)
        fsync_dir(real.parent)
    finally:
        staging.remove()


def write_text(output: Output, text: str) -> Path:
    """Writes ``text`` (UTF-8) as the file ``output``; returns the real path written."""
    with write_file(output) as path:
        path.write_text(text, encoding="utf-8")
    return output.resolve()
