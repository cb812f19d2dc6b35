"""Signals during ``fit``: a checkpoint at the next optimizer step, one line, exit ``128 + signal``.

In-process cases signal the test process itself from a callback (``_payloads_and_callbacks.SendSignalAt``)
at a known batch; the subprocess case kills a real ``fit`` from outside and resumes it with
``--ckpt_path last``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from cli_process import CliProcess
from conftest import REPO, tiny_fit_args

from mlm_adapt.cli.commands import main

HERE = Path(__file__).resolve().parent


def callback(class_name: str, **init_args) -> str:
    return "--trainer.callbacks+=" + json.dumps(
        {"class_path": f"_payloads_and_callbacks.{class_name}", "init_args": init_args}
    )


def last_checkpoints(root: Path) -> list[Path]:
    return sorted(root.rglob("last*.ckpt"))


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mlm_adapt: error:")]


# name: (signal, the batch it is sent at (or "train_end"), extra args, exit code, step of the checkpoint)
CASES = {
    "sigterm_mid_run": (signal.SIGTERM, 1, [], 143, 2),
    "sigusr1_requeue_signal": (signal.SIGUSR1, 2, [], 138, 3),
    # Batches 2 and 3 make optimizer step 2: the signal after batch 2 waits for the step.
    "sigterm_mid_accumulation": (signal.SIGTERM, 2, ["--trainer.accumulate_grad_batches=2"], 143, 2),
    "sigterm_after_last_step": (signal.SIGTERM, "train_end", [], 143, None),
    # Ctrl-C stops at once (Lightning's graceful shutdown): no checkpoint; the line names the step.
    "sigint_mid_run": (signal.SIGINT, 1, [], 130, "no checkpoint"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_signal_during_fit(case, tiny_model_dir, corpus_file, tmp_path, capsys):
    signum, when, extra, code, step = CASES[case]
    root = tmp_path / "run"
    sender = (
        callback("SendSignalAt", signum=int(signum), hook="train_end")
        if when == "train_end"
        else callback("SendSignalAt", signum=int(signum), batch_idx=when)
    )
    args = tiny_fit_args(tiny_model_dir, corpus_file, root, "--export.enabled=false", sender, *extra)
    previous = signal.getsignal(signum)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *args])
    assert stopped.value.code == code
    assert signal.getsignal(signum) == previous  # the test process's handlers are restored
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1, lines
    name = signal.Signals(signum).name
    if step is None:
        assert f"stopped by {name} outside the training steps" in lines[0]
        return
    if step == "no checkpoint":
        assert f"fit stopped by {name} at step 2; this stop wrote no checkpoint" in lines[0], lines
        assert not last_checkpoints(root)
        return
    (checkpoint,) = last_checkpoints(root)
    assert f"stopped by {name}: saved {checkpoint} at step {step}; continue with --ckpt_path last" in lines[0]
    assert torch.load(checkpoint, map_location="cpu", weights_only=True)["global_step"] == step
    assert not [p for p in checkpoint.parent.iterdir() if p.name.endswith(".tmp")]  # written atomically


def test_a_stop_checkpoint_that_is_not_there_is_not_named(
    tiny_model_dir, corpus_file, tmp_path, capsys, monkeypatch
):
    """The SIGTERM line names the checkpoint only if it exists (here the save writes nothing)."""
    import lightning as L

    root = tmp_path / "run"
    sender = callback("SendSignalAt", signum=int(signal.SIGTERM), batch_idx=1)
    args = tiny_fit_args(tiny_model_dir, corpus_file, root, "--export.enabled=false", sender)
    monkeypatch.setattr(L.Trainer, "save_checkpoint", lambda self, *args, **kwargs: None)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *args])
    assert stopped.value.code == 143
    (line,) = error_lines(capsys.readouterr().err)
    assert "fit stopped by SIGTERM at step 2, but its checkpoint " in line and "is missing" in line, line
    assert not last_checkpoints(root)


def _run(args: list[str], root: Path) -> CliProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    return CliProcess(["fit", *args], cwd=root, env=env)


def _state(checkpoint: Path) -> tuple[int, dict[str, torch.Tensor]]:
    loaded = torch.load(checkpoint, map_location="cpu", weights_only=True)
    return loaded["global_step"], loaded["state_dict"]


def _newest_state(root: Path) -> tuple[int, dict[str, torch.Tensor]]:
    """The state of the run's checkpoint with the highest step (the default ModelCheckpoint's at the end)."""
    return max((_state(path) for path in root.rglob("*.ckpt")), key=lambda state: state[0])


@pytest.mark.slow
def test_sigterm_from_outside_then_resume_matches_an_uninterrupted_run(tiny_model_dir, corpus_file, tmp_path):
    steps = 8
    common = ["--export.enabled=false", f"--trainer.max_steps={steps}"]
    whole_root, cut_root = tmp_path / "whole", tmp_path / "cut"
    whole_root.mkdir()
    cut_root.mkdir()
    whole = _run(tiny_fit_args(tiny_model_dir, corpus_file, whole_root, *common), whole_root)

    progress = cut_root / "progress.json"
    slow = callback("SlowSteps", progress=str(progress), seconds=0.5)
    cut = _run(tiny_fit_args(tiny_model_dir, corpus_file, cut_root, *common, slow), cut_root)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and cut.poll() is None:
        if progress.exists() and json.loads(progress.read_text())["step"] >= 3:
            break
        time.sleep(0.05)
    cut.send_signal(signal.SIGTERM)
    _, cut_err = cut.communicate(timeout=240)
    assert cut.returncode == 143, cut_err[-3000:]
    lines = error_lines(cut_err)
    assert len(lines) == 1 and "stopped by SIGTERM: saved" in lines[0], cut_err[-3000:]
    (checkpoint,) = last_checkpoints(cut_root)
    stopped_at, _ = _state(checkpoint)
    assert 3 <= stopped_at < steps

    resumed = _run(
        tiny_fit_args(tiny_model_dir, corpus_file, cut_root, *common, "--ckpt_path=last"), cut_root
    )
    _, resumed_err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, resumed_err[-3000:]
    _, whole_err = whole.communicate(timeout=240)
    assert whole.returncode == 0, whole_err[-3000:]

    whole_step, whole_state = _newest_state(whole_root)
    resumed_step, resumed_state = _newest_state(cut_root)
    assert whole_step == resumed_step == steps
    for key, value in whole_state.items():
        torch.testing.assert_close(resumed_state[key], value, rtol=0, atol=1e-6, msg=key)


def test_a_signal_of_one_command_does_not_end_the_next(tmp_path, capsys):
    """A signal recorded by an earlier command in this process (a stopped fit) is not the next one's: an
    ``export`` refused afterwards reports its own error with exit 2, not ``stopped by SIGTERM`` with 143."""
    from mlm_adapt.training.signals import STOP

    STOP.signum = signal.SIGTERM  # what a fit stopped by SIGTERM leaves behind
    with pytest.raises(SystemExit) as refused:
        main(["export", f"--ckpt_path={tmp_path / 'missing.ckpt'}", f"--output_dir={tmp_path / 'out'}"])
    lines = error_lines(capsys.readouterr().err)
    assert refused.value.code == 2 and len(lines) == 1 and "does not exist" in lines[0], lines


def test_after_a_stop_and_resume_last_ckpt_is_the_latest_state(tiny_model_dir, corpus_file, tmp_path, capsys):
    """As configs/domain.yaml saves: a ModelCheckpoint with save_last whose periodic save has not come yet.
    The resumed run rewrites the stop's last.ckpt (what export and the next resume read), no last-v1.ckpt."""
    root = tmp_path / "run"
    logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(root)}}
    checkpoint = [
        f"--trainer.logger={json.dumps(logger)}",  # versioned: the resume continues version_0
        "--trainer.callbacks+=ModelCheckpoint",
        "--trainer.callbacks.save_last=true",
        "--trainer.callbacks.every_n_train_steps=1000",
    ]
    args = tiny_fit_args(tiny_model_dir, corpus_file, root, "--export.enabled=false", *checkpoint)
    sender = callback("SendSignalAt", signum=int(signal.SIGTERM), batch_idx=1)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *args, sender])
    assert stopped.value.code == 143
    (stop_checkpoint,) = last_checkpoints(root)
    capsys.readouterr()
    main(["fit", *args, "--ckpt_path=last"])  # returns: the run finished
    assert last_checkpoints(root) == [stop_checkpoint]
    assert torch.load(stop_checkpoint, map_location="cpu", weights_only=True)["global_step"] == 6
