"""Checkpoint files: the user's umask, no leftovers of killed writes, weights-only reading."""

from __future__ import annotations

import os
import time

import pytest
import torch

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.training.resume import AtomicCheckpointIO, clean_checkpoint_tmp


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_checkpoint_follows_the_umask(tmp_path, umask_022):
    target = tmp_path / "ckpt" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1, "w": torch.ones(3)}, target)
    assert target.stat().st_mode & 0o777 == 0o644  # was 0600: tempfile.mkstemp ignores the umask


def test_stale_temp_files_of_a_killed_write_are_removed_at_the_next_save(tmp_path):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    stale = directory / ".last.ckpt.k2j3h4g5.tmp"  # what a kill during torch.save leaves
    live = directory / ".step4.ckpt.a1b2c3d4.tmp"  # another live process's write in progress
    user = directory / ".notes.tmp"
    for path in (stale, live, user):
        path.write_bytes(b"x")
    long_ago = time.time() - 3600
    os.utime(stale, (long_ago, long_ago))
    os.utime(user, (long_ago, long_ago))
    os.utime(live, (time.time() + 60, time.time() + 60))  # written after this process started
    AtomicCheckpointIO().save_checkpoint({"step": 2}, directory / "last.ckpt")
    assert sorted(p.name for p in directory.iterdir()) == [
        ".notes.tmp",
        ".step4.ckpt.a1b2c3d4.tmp",
        "last.ckpt",
    ]
    assert clean_checkpoint_tmp(directory) == []


def test_resume_load_is_weights_only(tmp_path):
    class CreatesMarker:
        def __reduce__(self):
            return exec, (f"open({str(tmp_path / 'pwned')!r}, 'w').close()",)

    torch.save({"state_dict": {}, "x": CreatesMarker()}, tmp_path / "evil.ckpt")
    with pytest.raises(MLMAdaptError, match=r"ckpt_path: refusing to load .*evil\.ckpt"):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "evil.ckpt")
    assert not (tmp_path / "pwned").exists()
