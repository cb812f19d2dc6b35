"""The path rules of outputs: symlink resolution, inputs and run directories, writability.

Symlink policy: an output path is resolved (``realpath``, every component); the real path is what is
checked against the inputs, locked and replaced, and a link the user pointed at it keeps pointing at the
new output. A link that leads nowhere (dangling, or a loop), in any component, is refused: writing
through it would create a file somewhere the user no longer expects. Checkpoint files are the one
exception (``follow_link=False``): Lightning itself makes ``last.ckpt`` a link to another checkpoint
(``save_last: link``), so such a name is replaced by the new file, never written through.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlm_adapt.errors import MLMAdaptError

_GLOB_CHARS = "*?["


def _absolute(given: str | Path) -> Path:
    path = Path(given).expanduser()
    return path if path.is_absolute() else Path.cwd() / path


def resolve(given: str | Path, key: str, follow_link: bool = True) -> Path:
    """The real path ``given`` names, refusing a dangling link or a link loop in any component.

    Args:
        given: The path as the user wrote it.
        key: The option that named it, for messages.
        follow_link: Resolve the last component too (``False``: only its directory).
    """
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


def _is_within(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


@dataclass(frozen=True)
class _Input:
    key: str
    given: str
    real: Path
    pattern: tuple[str, ...] | None = None  # for a glob: the parts after ``real``, its fixed directory


def _match(parts: Sequence[str], pattern: Sequence[str], prefix: bool) -> bool:
    """``glob``'s rules per path component (``**``: any number of them; ``*`` skips dot names).

    With ``prefix``, whether ``parts`` could be the leading components of a match (a directory whose
    contents the pattern may pick up).
    """
    if not parts:
        return prefix or not pattern or all(p == "**" for p in pattern)
    if not pattern:
        return False
    head, tail = pattern[0], pattern[1:]
    if head == "**":
        return prefix or any(_match(parts[i:], tail, prefix) for i in range(len(parts) + 1))
    name = parts[0]
    if name.startswith(".") and not head.startswith("."):
        return False
    return fnmatch.fnmatchcase(name, head) and _match(parts[1:], tail, prefix)


def _inputs(inputs: Mapping[str, Iterable[str | Path | None]]) -> list[_Input]:
    """The local inputs of a run, resolved; globs also as the files they match now. Hub names drop out."""
    found: list[_Input] = []
    for key, items in inputs.items():
        for item in items:
            if not item:
                continue
            given = str(item)
            path = Path(given).expanduser()
            if any(c in given for c in _GLOB_CHARS):
                fixed = list(path.parts)
                cut = next(i for i, p in enumerate(fixed) if any(c in p for c in _GLOB_CHARS))
                root = Path(os.path.realpath(Path(*fixed[:cut]) if cut else Path(".")))
                found.append(_Input(key, given, root, tuple(fixed[cut:])))
                matches = glob.glob(str(path), recursive=True)
                found += [_Input(key, m, Path(os.path.realpath(m))) for m in matches]
            elif os.path.lexists(path):
                found.append(_Input(key, given, Path(os.path.realpath(path))))
    return found


def refuse_inputs(
    real: Path,
    given: str | Path,
    key: str,
    directory: bool,
    inputs: Mapping[str, Iterable[str | Path | None]],
) -> None:
    """Refuses an output that is, contains, lies inside or would be matched by an input of the run."""
    hint = "write it elsewhere; outputs never replace or nest in inputs"
    for item in _inputs(inputs):
        what = None
        if item.pattern is not None:
            if _is_within(item.real, real):
                what = f"contains the input {item.given} ({item.key})"
            elif item.real in real.parents:
                rel = real.relative_to(item.real).parts
                if _match(rel, item.pattern, prefix=directory):
                    what = f"would be read as the input {item.given} ({item.key}) by the next run"
        elif real == item.real:
            what = f"is the input {item.given} ({item.key})"
        elif item.real in real.parents:
            what = f"lies inside the input {item.given} ({item.key})"
        elif real in item.real.parents:
            what = f"contains the input {item.given} ({item.key})"
        if what:
            raise MLMAdaptError(f"{key}: {shown(given, real)} {what}; {hint}")


def refuse_run_dirs(real: Path, given: str | Path, key: str, run_dirs: Iterable[str | Path]) -> None:
    """Refuses an output that is or contains the current directory or a run directory (checkpoints, logs)."""
    cwd = Path(os.path.realpath(Path.cwd()))
    if _is_within(cwd, real):
        what = "is the current directory" if real == cwd else f"contains the current directory {cwd}"
        raise MLMAdaptError(f"{key}: {given} {what}; give a directory of its own, e.g. ./export")
    for run_dir in run_dirs:
        run = Path(os.path.realpath(_absolute(run_dir)))
        if _is_within(run, real):
            what = "is the run directory" if real == run else f"contains the run directory {run}"
            raise MLMAdaptError(
                f"{key}: {given} {what} (checkpoints and logs); give a directory of its own, "
                f"e.g. {run / 'export'}"
            )


def check_writable(real: Path, given: str | Path, key: str, directory: bool) -> None:
    """Refuses, before any work, an output that could not be written: wrong kind, read-only, mount point.

    Missing parent directories are fine (they are created) if the nearest existing one is writable.
    """
    name = shown(given, real)
    if os.path.lexists(real):
        mode = os.stat(real, follow_symlinks=False).st_mode
        if directory and not stat.S_ISDIR(mode):
            raise MLMAdaptError(f"{key}: {name} is a file; give a directory")
        if not directory and stat.S_ISDIR(mode):
            raise MLMAdaptError(f"{key}: {name} is a directory; give a file path")
        if not directory and not stat.S_ISREG(mode) and not stat.S_ISLNK(mode):
            raise MLMAdaptError(f"{key}: {name} is not a regular file; give a file path")
        if directory and os.path.ismount(real):
            raise MLMAdaptError(
                f"{key}: {name} is a mount point, which an export cannot replace; give a directory inside "
                f"it, e.g. {real / 'model'}"
            )
        # A directory output is moved aside as a whole (a write to its ``..``); a file the user made
        # read-only is read as "keep this".
        if not stat.S_ISLNK(mode) and not os.access(real, os.W_OK):
            raise MLMAdaptError(f"{key}: {name} is read-only; make it writable or write elsewhere")
    ancestor = real.parent
    while not os.path.lexists(ancestor):
        ancestor = ancestor.parent
    if not os.path.isdir(ancestor):
        raise MLMAdaptError(f"{key}: cannot write {name}: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise MLMAdaptError(
            f"{key}: cannot write {name}: {ancestor} is read-only (or not writable by you); write elsewhere"
        )
