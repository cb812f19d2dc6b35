"""One ``fit`` per run root at a time: a second is refused in one line naming the holder; a killed
holder's lock does not block."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, run_cli, tiny_fit_args
from lock_holder import held_lock

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.locks import LOCK_RECORD, RUN_LOCK, run_root_locked


def test_a_held_run_root_is_refused_naming_its_holder_and_freed_when_released(tmp_path):
    root = tmp_path / "run"
    with held_lock("run_root_locked", root) as holder:
        with pytest.raises(MLMAdaptError) as refused, run_root_locked(root):
            pass
        message = str(refused.value)
        assert message.startswith(
            f"trainer.default_root_dir: the run root {root} is being written by another mlm_adapt process "
            f"(pid {holder} on "
        ), message
        assert message.endswith("; wait for it to finish or choose another directory") and "\n" not in message
    with run_root_locked(root):  # released with its holder
        assert (root / RUN_LOCK).is_file()
    assert list(root.iterdir()) == []  # the lock file goes with the lock


def test_a_lock_file_a_killed_fit_left_does_not_block(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    (root / RUN_LOCK).write_bytes(LOCK_RECORD + b"pid 999999 on elsewhere, since 2026-01-01 00:00:00 UTC\n")
    with run_root_locked(root):
        assert b"pid 999999" not in (root / RUN_LOCK).read_bytes()
    assert list(root.iterdir()) == []


def test_a_users_file_at_the_lock_name_is_refused_and_kept(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    (root / RUN_LOCK).write_text("my notes", encoding="utf-8")
    refused = "exists and is not an mlm_adapt lock file; move it away"
    with pytest.raises(MLMAdaptError, match=refused), run_root_locked(root):
        pass
    assert (root / RUN_LOCK).read_text(encoding="utf-8") == "my notes"


@pytest.mark.slow
def test_a_second_fit_in_a_running_fits_root_is_refused_and_runs_once_the_first_is_killed(
    tiny_model_dir, corpus_file, tmp_path
):
    root = tmp_path / "run"
    logger = f'{{"class_path": "CSVLogger", "init_args": {{"save_dir": "{root}", "name": "csv"}}}}'
    checkpoint = ("--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.save_last=true")
    args = tiny_fit_args(tiny_model_dir, corpus_file, root, f"--trainer.logger={logger}", *checkpoint)
    slow = ("--trainer.max_steps=50", "--trainer.callbacks+=tests.recorder.BatchRecorder")
    slow += (f"--trainer.callbacks.out_dir={tmp_path / 'rec'}", "--trainer.callbacks.pause_s=1")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.Popen(
        [sys.executable, "-m", "mlm_adapt", "fit", *args, *slow],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "rec" / "rank0.jsonl").is_file():  # training: the first batch recorded
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        for extra in ((), ("--ckpt_path=last",)):
            second = run_cli("fit", *args, *extra)
            assert second.returncode == 2, second.stderr[-3000:]
            lines = [line for line in second.stderr.splitlines() if line.startswith("mlm_adapt")]
            assert len(lines) == 1, second.stderr[-3000:]
            assert lines[0].startswith(
                f"mlm_adapt: error: trainer.default_root_dir: the run root {root} is being written by "
                f"another mlm_adapt process (pid {first.pid} on {os.uname().nodename}, since "
            ), lines
            assert lines[0].endswith("); wait for it to finish or choose another directory")
        assert sorted(p.name for p in (root / "csv").iterdir()) == ["version_0"]
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    again = run_cli("fit", *args, "--trainer.max_steps=2")  # the killed fit's lock does not block
    assert again.returncode == 0, again.stderr[-3000:]
    assert not (root / RUN_LOCK).exists()
