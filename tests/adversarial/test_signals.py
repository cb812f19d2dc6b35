"""Signals during ``fit``: a checkpoint at the next optimizer step, one line, exit ``128 + signal``.

Each case signals the test process itself from a callback (``_payloads_and_callbacks.SendSignalAt``) at a
known batch (test_stop_contract signals a real ``fit`` from outside).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from conftest import tiny_fit_args

from mlm_adapt.cli.commands import main


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
    args = tiny_fit_args(tiny_model_dir, corpus_file, root, "--export.checkpoint=none", sender, *extra)
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


def test_a_stop_while_the_corpus_is_prepared_names_no_step(tiny_model_dir, corpus_file, tmp_path, capsys):
    """SIGTERM while fit preprocessed said "at step 0; this stop wrote no checkpoint (SIGTERM writes one
    first)": no step had run and nothing could have been written."""
    segmenter = (
        '--data.segmentation.segmenter={"class_path": "_payloads_and_callbacks.SignalWhileSegmenting"}'
    )
    root = tmp_path / "run"
    args = tiny_fit_args(tiny_model_dir, corpus_file, root, "--export.checkpoint=none", segmenter)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *args])
    assert stopped.value.code == 143
    (line,) = error_lines(capsys.readouterr().err)
    assert line == (
        "mlm_adapt: error: fit stopped by SIGTERM outside the training steps; no checkpoint written by "
        "this run"
    )
    assert not last_checkpoints(root)


def test_a_stop_checkpoint_that_is_not_there_is_not_named(
    tiny_model_dir, corpus_file, tmp_path, capsys, monkeypatch
):
    """The SIGTERM line names the checkpoint only if it exists (here the save writes nothing)."""
    import lightning as L

    root = tmp_path / "run"
    sender = callback("SendSignalAt", signum=int(signal.SIGTERM), batch_idx=1)
    args = tiny_fit_args(tiny_model_dir, corpus_file, root, "--export.checkpoint=none", sender)
    monkeypatch.setattr(L.Trainer, "save_checkpoint", lambda self, *args, **kwargs: None)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *args])
    assert stopped.value.code == 143
    (line,) = error_lines(capsys.readouterr().err)
    assert "fit stopped by SIGTERM at step 2, but its checkpoint " in line and "is missing" in line, line
    assert not last_checkpoints(root)


def test_a_signal_of_one_command_does_not_end_the_next(tmp_path, capsys):
    """A signal recorded by an earlier command in this process (a stopped fit) is not the next one's: an
    ``export`` refused afterwards reports its own error with exit 2, not ``stopped by SIGTERM`` with 143."""
    from mlm_adapt.training.signals import STOP

    STOP.signum = signal.SIGTERM  # what a fit stopped by SIGTERM leaves behind
    with pytest.raises(SystemExit) as refused:
        main(["export", f"--ckpt_path={tmp_path / 'missing.ckpt'}", f"--output_dir={tmp_path / 'out'}"])
    lines = error_lines(capsys.readouterr().err)
    assert refused.value.code == 2 and len(lines) == 1 and "does not exist" in lines[0], lines
