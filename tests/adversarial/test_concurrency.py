"""Concurrent and interrupted writers: the lock, ``overwrite`` decided at publish time, leftovers.

A live writer is another process holding the output's lock; a killed one is played by what it leaves on
disk: a staging directory whose marker lock is released, a lock file nobody holds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from _output_workspace import Workspace, assert_one_line, leftovers, tree_hashes, world, ws
from conftest import REPO, run_main
from lock_holder import held_lock

from mlm_adapt.export import writer
from mlm_adapt.guard.locks import LOCK_RECORD, STAGING_MARKER, Staging, create_staging
from mlm_adapt.guard.outputs import MARKER, Output, is_complete_export, write_directory

__all__ = ["world", "ws"]

EXPORT = ["export", "--ckpt_path=./run/last.ckpt"]
# One of several processes filling one shared cache: each takes the lock ROUNDS times, waiting for the others,
# and records when it held it (CLOCK_MONOTONIC is one clock for every process of the machine).
RACER = """
import sys, time
from pathlib import Path
from mlm_adapt.guard.locks import locked
target, rounds, record = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
held = []
for _ in range(rounds):
    with locked(target, "cache", "the cache", wait=True):
        start = time.monotonic()
        time.sleep(0.001)
        held.append(f"{start} {time.monotonic()}")
record.write_text("\\n".join(held), encoding="utf-8")
"""


@pytest.mark.parametrize("output", ["exp", "current"], ids=["same_path", "link_to_it"])
def test_a_live_writers_lock_refuses_a_second_writer(output, ws: Workspace, capsys):
    (ws.root / "current").symlink_to("exp")  # another spelling of exp: the lock is on the real path
    with held_lock("locked", ws.exp, "holder", str(ws.exp)):
        before = tree_hashes(ws.root.parent)
        code, out, err = run_main([*EXPORT, f"--output_dir={output}", "--overwrite"], capsys)
        assert tree_hashes(ws.root.parent) == before
    assert code == 2 and "wrote" not in out, err
    assert_one_line(
        err,
        f"--output_dir: {output}",
        "is being written by another mlm_adapt process (pid ",
        "); wait for it to finish or choose another directory",
    )
    assert leftovers(ws.root.parent) == []


def test_a_file_appearing_during_overwrite_stops_the_publish(ws: Workspace, capsys, monkeypatch):
    """``overwrite`` is decided again at publish time: a user's file written meanwhile is never replaced."""
    real_verify = writer.verify_export

    def verify(model, tokenizer, directory, name=None) -> float:
        diff = real_verify(model, tokenizer, directory, name=name)
        (ws.exp / "notes.txt").write_text("appeared meanwhile", encoding="utf-8")  # a writer taking no lock
        return diff

    monkeypatch.setattr(writer, "verify_export", verify)
    before = tree_hashes(ws.exp)
    code, out, err = run_main([*EXPORT, "--output_dir=exp", "--overwrite"], capsys)
    assert code == 2 and "wrote" not in out, err
    assert_one_line(err, "exp was written by another process while this command ran")
    after = tree_hashes(ws.exp)
    assert after.pop("notes.txt") and after == before
    assert leftovers(ws.root.parent) == []


def _killed_staging(target: Path, old: bool = False) -> Path:
    """What a writer killed mid-export leaves: a marked staging directory whose lock died with it."""
    staging = create_staging(target)
    staging.payload.mkdir()
    (staging.payload / "model.safetensors").write_text("half", encoding="utf-8")
    if old:
        os.rename(target, staging.backup)  # killed between the two renames of a replacement
    staging.marker_lock.release(force=True)
    return staging.path


_LIVE: list[Staging] = []


def _live_staging(exp: Path) -> Path:
    """A live writer's staging directory, kept referenced: a lock garbage-collected is released."""
    staging = create_staging(exp)
    _LIVE.append(staging)
    return staging.path


def _forged(exp: Path) -> Path:
    """A directory with our name pattern and a marker that names another target."""
    path = exp.parent / f".{exp.name}.staging-cafe"
    path.mkdir()
    record = {"format": "mlm_adapt staging", "target": "other", "token": "cafe"}
    (path / STAGING_MARKER).write_text(json.dumps(record), encoding="utf-8")
    return path


def _user_dir(exp: Path) -> Path:
    path = exp.parent / ".exp.staging-mynotes"
    path.mkdir()
    (path / "notes.md").write_text("my notes", encoding="utf-8")
    return path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# name: (what is left beside exp, whether the next export removes it)
LEFTOVERS: dict[str, tuple[Callable[[Path], Path], bool]] = {
    "killed_writer_staging_is_cleaned": (_killed_staging, True),
    "killed_between_renames_restores_then_cleans": (lambda exp: _killed_staging(exp, old=True), True),
    "live_writer_staging_is_kept": (_live_staging, False),
    "user_dir_with_our_name_is_kept": (_user_dir, False),
    "marker_for_another_target_is_kept": (_forged, False),
    "staging_named_file_is_kept": (lambda exp: _write(exp.parent / ".exp.staging-0123", b"mine"), False),
    "stale_lock_of_a_killed_process_is_reused": (
        lambda exp: _write(exp.parent / ".exp.lock", LOCK_RECORD),
        True,
    ),
}


@pytest.mark.parametrize("case", list(LEFTOVERS), ids=list(LEFTOVERS))
def test_only_proven_leftovers_are_cleaned(case, ws: Workspace, capsys):
    make, removed = LEFTOVERS[case]
    original = tree_hashes(ws.exp)
    left = make(ws.exp)
    kept = tree_hashes(left)
    if "restores" in case:
        assert not ws.exp.exists()
        # The next export first renames the earlier export back, then refuses to replace it.
        code, _, err = run_main([*EXPORT, "--output_dir=exp"], capsys)
        assert code == 2 and "is not empty" in err
        assert tree_hashes(ws.exp) == original
    else:
        code, _, err = run_main([*EXPORT, "--output_dir=exp", "--overwrite"], capsys)
        assert code == 0, err
        assert is_complete_export(ws.exp) and (ws.exp / MARKER).is_file()
    assert os.path.lexists(left) is not removed
    if not removed:
        assert tree_hashes(left) == kept
        if left.is_dir():  # out of the way of the check below
            shutil.rmtree(left)
    assert leftovers(ws.root.parent) == []


class _SafetensorError(Exception):
    """What safetensors raises on a full disk: no OSError, only the text."""


def _fail_on_second_rename(staging: Path, mp: pytest.MonkeyPatch) -> None:
    real_rename, calls = os.rename, []

    def rename(src, dst):
        calls.append(src)
        if len(calls) == 2:  # the earlier export is aside in ``old``; the new one cannot take its place
            raise PermissionError(13, "Permission denied", str(dst))
        real_rename(src, dst)

    mp.setattr(os, "rename", rename)


def _raise(exc: BaseException) -> Callable[[Path, pytest.MonkeyPatch], None]:
    def fail(staging: Path, mp: pytest.MonkeyPatch) -> None:
        raise exc

    return fail


# name: (what fails inside the write, the error the caller sees, text in it with the user's path)
INTERRUPTED = {
    "disk_full_library_error_names_the_user_path": (
        _raise(_SafetensorError("No space left on device (os error 28)")),
        OSError,
        "No space left on device: '{exp}'",
    ),
    "interrupt_midway_keeps_the_earlier_export": (_raise(KeyboardInterrupt()), KeyboardInterrupt, ""),
    "failed_swap_puts_the_earlier_export_back": (_fail_on_second_rename, PermissionError, "{exp}"),
}


@pytest.mark.parametrize("case", list(INTERRUPTED), ids=list(INTERRUPTED))
def test_interrupted_write_loses_nothing(case, ws: Workspace, monkeypatch):
    fail, error, text = INTERRUPTED[case]
    before = tree_hashes(ws.exp)
    with pytest.raises(error) as raised, write_directory(Output(ws.exp, overwrite=True)) as staging:
        (staging / "model.safetensors").write_text("new weights", encoding="utf-8")
        fail(staging, monkeypatch)
    monkeypatch.undo()
    assert text.format(exp=ws.exp) in str(raised.value) and ".staging-" not in str(raised.value)
    assert tree_hashes(ws.exp) == before
    assert leftovers(ws.root.parent) == [] and not list(ws.root.glob(".exp.staging-*"))


def test_waiters_on_a_shared_cache_hold_its_lock_one_at_a_time(tmp_path):
    """A waiter is never refused by a lock file another process is creating or marking, and never two
    processes hold the lock at once, though each holder removes the lock file before it releases it."""
    target, rounds = tmp_path / "cache", 40
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(target), str(rounds), str(tmp_path / f"held{i}")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(6)
    ]
    errors = [racer.communicate(timeout=120)[1] for racer in racers]
    assert [racer.returncode for racer in racers] == [0] * len(racers), errors
    held = sorted(
        tuple(map(float, line.split()))
        for i in range(len(racers))
        for line in (tmp_path / f"held{i}").read_text(encoding="utf-8").splitlines()
    )
    assert len(held) == rounds * len(racers)
    overlaps = [(a, b) for a, b in zip(held, held[1:], strict=False) if b[0] < a[1]]
    assert overlaps == []
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("held")) == []
