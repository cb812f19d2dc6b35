"""Concurrent and interrupted writers: the lock, ``overwrite`` decided at publish time, leftovers.

Another process is played by what it leaves on disk: an ``flock`` held on a second open file description
(the kernel does not tell it from another process's), a staging directory whose marker lock is held (a
live writer) or released (a killed one), an export that appears while ours is written.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import pytest
from _output_workspace import Workspace, assert_one_line, leftovers, run, tree_hashes, world, ws

from mlm_adapt.export import writer
from mlm_adapt.guard.locks import STAGING_MARKER, create_staging
from mlm_adapt.guard.outputs import MARKER, Output, is_complete_export, write_directory

__all__ = ["world", "ws"]

EXPORT = ["export", "--ckpt_path=./run/last.ckpt"]


@contextmanager
def held_lock(path: Path, pid: int = 4242, host: str = "node7") -> Iterator[None]:
    """Another mlm_adapt process holding the lock file ``path`` (its record names ``pid`` on ``host``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    os.write(fd, json.dumps({"format": "mlm_adapt lock", "pid": pid, "host": host}).encode())
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        yield
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def _another_export_appears(target: Path, extra: str | None = None) -> Callable[..., float]:
    """A verify_export that, while ours is being written, lets a non-locking writer finish at ``target``."""
    real_verify = writer.verify_export

    def verify(model, tokenizer, directory, name=None) -> float:
        diff = real_verify(model, tokenizer, directory, name=name)
        if extra is None:
            shutil.copytree(target.parent / "exp", target, dirs_exist_ok=True)
        else:
            (target / extra).write_text("appeared meanwhile", encoding="utf-8")
        return diff

    return verify


@dataclass(frozen=True)
class Race:
    """One export racing another writer: its arguments, the race, and the one line it must end with."""

    name: str
    args: list[str]
    race: Callable[[Workspace, pytest.MonkeyPatch], object]
    needles: tuple[str, ...]
    appears: str | None = None  # the directory another writer completes while ours runs


def _lock(name: str) -> Callable[[Workspace, pytest.MonkeyPatch], object]:
    return lambda ws, mp: held_lock(ws.root / name)


def _appears(name: str, extra: str | None = None) -> Callable[[Workspace, pytest.MonkeyPatch], object]:
    def race(ws: Workspace, mp: pytest.MonkeyPatch) -> None:
        mp.setattr(writer, "verify_export", _another_export_appears(ws.root / name, extra))

    return race


RACES = [
    Race(
        "lock_held_by_another_export",
        [*EXPORT, "--output_dir=exp", "--overwrite"],
        _lock(".exp.lock"),
        ("--output_dir: exp is being written by another mlm_adapt process (pid 4242 on node7)",),
    ),
    Race(
        "lock_held_on_a_new_directory",
        [*EXPORT, "--output_dir=out/model"],
        _lock("out/.model.lock"),
        ("out/model is being written by another mlm_adapt process",),
    ),
    Race(
        "lock_held_on_the_real_path_of_a_link",
        [*EXPORT, "--output_dir=current", "--overwrite"],
        lambda ws, mp: ((ws.root / "current").symlink_to("exp"), held_lock(ws.root / ".exp.lock"))[1],
        ("current (->", "is being written by another mlm_adapt process"),
    ),
    Race(
        "second_export_finishing_first_without_overwrite",
        [*EXPORT, "--output_dir=fresh"],
        _appears("fresh"),
        ("--output_dir: fresh was written by another process while this command ran; nothing was replaced",),
        appears="fresh",
    ),
    Race(
        "user_file_appearing_during_overwrite",
        [*EXPORT, "--output_dir=exp", "--overwrite"],
        _appears("exp", extra="notes.txt"),
        ("exp was written by another process while this command ran",),
        appears="exp",
    ),
]


@pytest.mark.parametrize("case", RACES, ids=[c.name for c in RACES])
def test_racing_writer_wins_and_ours_changes_nothing(case: Race, ws: Workspace, capsys, monkeypatch):
    held = case.race(ws, monkeypatch)
    with held if isinstance(held, AbstractContextManager) else nullcontext():
        before = tree_hashes(ws.root.parent)
        code, out, err = run(case.args, capsys)
        if case.appears is None:
            assert tree_hashes(ws.root.parent) == before
    assert code == 2, err
    assert_one_line(err, *case.needles)
    assert "wrote" not in out
    if case.appears is not None:  # the other writer's result is what stays
        assert (ws.root / case.appears / "model.safetensors").read_text(encoding="utf-8") == "w"
    assert leftovers(ws.root.parent) == []


def _killed_staging(target: Path, old: bool = False) -> Path:
    """What a writer killed mid-export leaves: a marked staging directory whose lock died with it."""
    staging = create_staging(target)
    (staging.payload).mkdir()
    (staging.payload / "model.safetensors").write_text("half", encoding="utf-8")
    if old:
        os.rename(target, staging.backup)  # killed between the two renames of a replacement
    os.close(staging.marker_fd)
    return staging.path


def _forged(exp: Path, **changes: str) -> Path:
    """A directory with our name pattern and a marker that does not match it (another target or token)."""
    path = exp.parent / f".{exp.name}.staging-{changes.pop('suffix', 'cafe')}"
    path.mkdir()
    record = {"format": "mlm_adapt staging", "target": exp.name, "token": "cafe", "pid": 1, "host": "x"}
    (path / STAGING_MARKER).write_text(json.dumps({**record, **changes}), encoding="utf-8")
    return path


@dataclass(frozen=True)
class Leftover:
    """Something beside ``exp`` before an export into it: whether the export removes it."""

    name: str
    make: Callable[[Path], Path | None]
    removed: bool


LEFTOVERS = [
    Leftover("killed_writer_staging_is_cleaned", lambda exp: _killed_staging(exp), removed=True),
    Leftover(
        "killed_between_renames_restores_then_cleans",
        lambda exp: _killed_staging(exp, old=True),
        removed=True,
    ),
    Leftover("live_writer_staging_is_kept", lambda exp: create_staging(exp).path, removed=False),
    Leftover(
        "user_dir_with_our_name_is_kept",
        lambda exp: _mkdir(exp.parent / ".exp.staging-mynotes"),
        removed=False,
    ),
    Leftover("marker_for_another_target_is_kept", lambda exp: _forged(exp, target="other"), removed=False),
    Leftover("marker_with_another_token_is_kept", lambda exp: _forged(exp, suffix="beef"), removed=False),
    Leftover(
        "staging_named_file_is_kept", lambda exp: _touch(exp.parent / ".exp.staging-0123"), removed=False
    ),
    Leftover("stale_lock_of_a_killed_process_is_reused", lambda exp: _stale_lock(exp), removed=True),
]


def _mkdir(path: Path) -> Path:
    path.mkdir()
    (path / "notes.md").write_text("my notes", encoding="utf-8")
    return path


def _touch(path: Path) -> Path:
    path.write_text("mine", encoding="utf-8")
    return path


def _stale_lock(exp: Path) -> Path:
    lock = exp.parent / ".exp.lock"
    lock.write_text(json.dumps({"format": "mlm_adapt lock", "pid": 99999, "host": "gone"}), encoding="utf-8")
    return lock


@pytest.mark.parametrize("case", LEFTOVERS, ids=[c.name for c in LEFTOVERS])
def test_only_proven_leftovers_are_cleaned(case: Leftover, ws: Workspace, capsys):
    original = tree_hashes(ws.exp)
    left = case.make(ws.exp)
    kept = tree_hashes(left)
    if "restores" in case.name:
        assert not ws.exp.exists()
        # The next export first renames the earlier export back, then refuses to replace it.
        code, _, err = run([*EXPORT, "--output_dir=exp"], capsys)
        assert code == 2 and "is not empty" in err
        assert tree_hashes(ws.exp) == original
    else:
        code, _, err = run([*EXPORT, "--output_dir=exp", "--overwrite"], capsys)
        assert code == 0, err
        assert is_complete_export(ws.exp) and (ws.exp / MARKER).is_file()
    assert os.path.lexists(left) is not case.removed
    if not case.removed:
        assert tree_hashes(left) == kept
    if not case.removed and left.is_dir():  # kept, as it should be; out of the way of the check below
        shutil.rmtree(left)
    assert leftovers(ws.root.parent) == []


def test_two_sequential_exports_without_overwrite(ws: Workspace, capsys):
    """The issue's "both print wrote": the second refuses and the first export is the one that stays."""
    code, out, err = run([*EXPORT, "--output_dir=twice"], capsys)
    assert code == 0 and "wrote" in out, err
    first = tree_hashes(ws.root / "twice")
    code, out, err = run([*EXPORT, "--output_dir=twice"], capsys)
    assert code == 2 and "wrote" not in out
    assert_one_line(err, "--output_dir: twice is not empty; pass overwrite to replace the earlier export")
    assert tree_hashes(ws.root / "twice") == first
    assert leftovers(ws.root.parent) == []


class _SafetensorError(Exception):
    """What safetensors raises on a full disk: no OSError, only the text."""


def _fail_on_second_rename(mp: pytest.MonkeyPatch) -> None:
    real_rename, calls = os.rename, []

    def rename(src, dst):
        calls.append(src)
        if len(calls) == 2:  # the earlier export is aside in ``old``; the new one cannot take its place
            raise PermissionError(13, "Permission denied", str(dst))
        real_rename(src, dst)

    mp.setattr(os, "rename", rename)


@dataclass(frozen=True)
class Interrupted:
    """A write into an earlier export that fails midway: the error the user sees, and nothing lost."""

    name: str
    fail: Callable[[Path, pytest.MonkeyPatch], None]  # called inside the write (staging path, monkeypatch)
    error: type[BaseException]
    text: str  # in str(error), with the user's path


def _raise(exc: Callable[[Path], BaseException]) -> Callable[[Path, pytest.MonkeyPatch], None]:
    def fail(staging: Path, mp: pytest.MonkeyPatch) -> None:
        raise exc(staging)

    return fail


INTERRUPTED = [
    Interrupted(
        "disk_full_oserror_names_the_user_path",
        _raise(lambda s: OSError(28, "No space left on device", str(s / "model.safetensors"))),
        OSError,
        "{exp}/model.safetensors",
    ),
    Interrupted(
        "disk_full_library_error_names_the_user_path",
        _raise(lambda s: _SafetensorError("No space left on device (os error 28)")),
        OSError,
        "{exp}",
    ),
    Interrupted(
        "interrupt_midway_keeps_the_earlier_export",
        _raise(lambda s: KeyboardInterrupt()),
        KeyboardInterrupt,
        "",
    ),
    Interrupted(
        "failed_swap_puts_the_earlier_export_back",
        lambda s, mp: _fail_on_second_rename(mp),
        PermissionError,
        "{exp}",
    ),
]


@pytest.mark.parametrize("case", INTERRUPTED, ids=[c.name for c in INTERRUPTED])
def test_interrupted_write_loses_nothing(case: Interrupted, ws: Workspace, monkeypatch):
    before = tree_hashes(ws.exp)
    with pytest.raises(case.error) as raised, write_directory(Output(ws.exp, overwrite=True)) as staging:
        (staging / "model.safetensors").write_text("new weights", encoding="utf-8")
        case.fail(staging, monkeypatch)
    monkeypatch.undo()
    assert case.text.format(exp=ws.exp) in str(raised.value) and ".staging-" not in str(raised.value)
    assert tree_hashes(ws.exp) == before
    assert leftovers(ws.root.parent) == [] and not list(ws.root.glob(".exp.staging-*"))
