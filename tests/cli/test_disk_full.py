"""A full disk is one line, not torch's inline_container.cc failure; the commands name the file they write.

Needs a small tmpfs (``mount -t tmpfs``, root or CAP_SYS_ADMIN); skipped where it cannot be mounted.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from conftest import tiny_fit_args

from mlm_adapt.cli import main
from mlm_adapt.errors import user_message


@pytest.fixture
def full_disk(tmp_path) -> Path:
    """A 256 KiB tmpfs, unmounted afterwards."""
    mount_point = tmp_path / "small_disk"
    mount_point.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    yield mount_point
    # Lazy: a process that still has a file open there (a busy mount) must not leave it mounted.
    subprocess.run(["umount", "--lazy", str(mount_point)], check=False, timeout=30)


def test_torch_save_on_a_full_disk_is_recognised_in_torch_words(full_disk):
    target = full_disk / "weights.pt"
    with pytest.raises(Exception) as raised, target.open("wb") as handle:
        torch.save({"w": torch.zeros(1_000_000)}, handle)  # 4 MB into 256 KiB
    assert not isinstance(raised.value, OSError)  # torch's RuntimeError, which names no file
    message, code = user_message(raised.value)
    assert message == "no space left on device; free some space there or write elsewhere" and code == 1


def test_fit_writing_checkpoints_on_a_full_disk(full_disk, tiny_model_dir, corpus_file, tmp_path, capsys):
    # The datasets cache stays on the big disk; logs and checkpoints (~0.9 MB with Adam state) go to tmpfs.
    args = tiny_fit_args(
        tiny_model_dir,
        corpus_file,
        tmp_path,
        f"--trainer.default_root_dir={full_disk}",
        "--export.checkpoint=none",
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 1
    assert err[-1].startswith(f"mlm_adapt: error: no space left on device writing {full_disk}/"), err[-5:]
    assert not any("Traceback" in line or "inline_container" in line for line in err)
