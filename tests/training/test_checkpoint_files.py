"""Checkpoint files: the user's umask, no leftovers of killed writes, weights-only reading."""

from __future__ import annotations

import os

import pytest
import torch

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.locks import create_staging
from mlm_adapt.training.checkpoint_files import AtomicCheckpointIO


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_checkpoint_follows_the_umask(tmp_path, umask_022):
    target = tmp_path / "ckpt" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1, "w": torch.ones(3)}, target)
    assert target.stat().st_mode & 0o777 == 0o644  # not the 0600 of tempfile.mkstemp, which ignores the umask


def test_staging_of_a_killed_write_is_removed_at_the_next_save_and_nothing_else(tmp_path):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    target = directory / "last.ckpt"
    killed = create_staging(target)  # what a kill during torch.save leaves: its lock is gone with it
    (killed.path / "new").write_bytes(b"half a checkpoint")
    killed.marker_lock.release(force=True)
    live = create_staging(directory / "step4.ckpt")  # another live process's write in progress
    user = directory / ".last.ckpt.staging-mine"  # a user's, with our name but no marker
    user.mkdir()
    (directory / ".notes.tmp").write_bytes(b"x")
    AtomicCheckpointIO().save_checkpoint({"step": 2}, target)
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        [".notes.tmp", ".last.ckpt.staging-mine", live.path.name, "last.ckpt"]
    )
    live.remove()


def test_a_last_checkpoint_link_is_replaced_not_written_through(tmp_path):
    best = tmp_path / "epoch=1.ckpt"
    best.write_bytes(b"the best weights")
    (tmp_path / "last.ckpt").symlink_to(best.name)  # save_last: link
    AtomicCheckpointIO().save_checkpoint({"step": 3}, tmp_path / "last.ckpt")
    assert best.read_bytes() == b"the best weights"
    assert not (tmp_path / "last.ckpt").is_symlink()


def test_resume_load_is_weights_only(tmp_path):
    class CreatesMarker:
        def __reduce__(self):
            return exec, (f"open({str(tmp_path / 'pwned')!r}, 'w').close()",)

    torch.save({"state_dict": {}, "x": CreatesMarker()}, tmp_path / "evil.ckpt")
    with pytest.raises(MLMAdaptError, match=r"ckpt_path: refusing to load .*evil\.ckpt"):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "evil.ckpt")
    assert not (tmp_path / "pwned").exists()
