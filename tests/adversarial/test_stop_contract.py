"""The stop contract of ``export`` and ``fit``: stopped by SIGINT, SIGTERM or SIGKILL, each ends in one line
(none for SIGKILL) with ``128 + signal``, leaves no process behind, its inputs byte-identical, nothing
half-written where its output goes, and the same command then succeeds.

``export`` is held (a test-only hook, in the stopped process only: :func:`hold_in`) after the weights are
written into its staging directory, and after the export marker is written there, just before the
publishing rename. ``fit`` is signalled from outside while it trains with two DataLoader workers.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from cli_process import CliProcess, descendant_pids, prepare_args, run_command, wait_gone
from conftest import REPO, tiny_fit_args

from mlm_adapt.guard.outputs import MARKER

HERE = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")])}
SIGNALS = {"SIGINT": (signal.SIGINT, 130), "SIGTERM": (signal.SIGTERM, 143), "SIGKILL": (signal.SIGKILL, -9)}
HELD = "stop contract test: held at"
HELD_COMMAND = """
import sys
import test_stop_contract
test_stop_contract.hold_in(sys.argv.pop(1))
from mlm_adapt.cli.commands import main
main()
"""


def hold_in(spec: str) -> None:
    """Test-only: ``module:Class.method`` (or ``module:function``) waits (a sleep) once it has returned."""
    module_name, _, attribute = spec.partition(":")
    owner = importlib.import_module(module_name)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    original = getattr(owner, name)

    def held(*args, **kwargs):
        result = original(*args, **kwargs)
        print(f"{HELD} {spec} (pid {os.getpid()})", file=sys.stderr, flush=True)
        time.sleep(300)
        return result

    setattr(owner, name, held)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("mlm_adapt: error:")]


def _wait_for(proc: CliProcess, ready, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ready():
            return
        if proc.poll() is not None:
            out, err = proc.communicate(0)
            raise AssertionError(f"ended ({proc.returncode}) before it was stopped: {(out + err)[-3000:]}")
        time.sleep(0.05)
    raise AssertionError("the command never reached the phase to stop it in")


def _stop(proc: CliProcess, signum: int, ready) -> tuple[str, list[int]]:
    """Sends ``signum`` once ``ready()``; returns the output and the processes the command had then."""
    try:
        _wait_for(proc, ready)
        processes = descendant_pids(proc.pid)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc._process.kill()
    return out + err, processes


# --- export ------------------------------------------------------------------------------------------

EXPORT_PHASES = {
    # The weights are in the staging directory; the tokenizer, config and card are not yet.
    "saving-weights": "transformers.PreTrainedModel.save_pretrained",
    # Everything is written and marked complete in the staging directory; the rename is next.
    "publishing": "mlm_adapt.guard.outputs:write_marker",
}
EXPORT_TABLE = [(phase, name) for phase in EXPORT_PHASES for name in SIGNALS]


def _export_held_spec(phase: str) -> str:
    spec = EXPORT_PHASES[phase]
    if ":" not in spec:  # transformers.PreTrainedModel.save_pretrained
        module, _, rest = spec.partition(".")
        spec = f"{module}:{rest}"
    return spec


@pytest.mark.parametrize(("phase", "signame"), EXPORT_TABLE, ids=[f"{p}-{s}" for p, s in EXPORT_TABLE])
def test_export_stopped_while_writing(phase, signame, trained_run, tmp_path):
    signum, status = SIGNALS[signame]
    ckpt = trained_run / "checkpoints" / "last.ckpt"
    before = digest(ckpt)
    out_dir = tmp_path / "exported"
    args = ["export", f"--ckpt_path={ckpt}", f"--output_dir={out_dir}", "--progress_bar=false"]
    proc = CliProcess([_export_held_spec(phase), *args], cwd=tmp_path, env=ENV, code=HELD_COMMAND)
    output, processes = _stop(proc, signum, lambda: HELD in proc._err.read_text(errors="replace"))

    assert proc.returncode == status, output[-3000:]
    assert not wait_gone(processes), f"processes outlived the stopped export: {processes}"
    if signum != signal.SIGKILL:
        assert error_lines(output) == [
            f"mlm_adapt: error: export stopped by {signame}; nothing was published and the inputs are "
            "untouched; run the same command again"
        ], output[-3000:]
        assert "Traceback" not in output, output[-3000:]
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".exported")] == []
    assert not out_dir.exists()  # absent: never a directory without its files
    assert digest(ckpt) == before
    left_lock = (tmp_path / ".exported.lock").exists()
    assert left_lock == (signum == signal.SIGKILL)

    rerun = run_command(args, cwd=tmp_path, env=ENV, timeout=300)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    takeovers = [line for line in rerun.stderr.splitlines() if line.startswith("mlm_adapt: taking over")]
    assert len(takeovers) == left_lock, rerun.stderr[-2000:]
    assert (out_dir / MARKER).is_file() and (out_dir / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".exported")] == []
    assert digest(ckpt) == before


# --- fit -----------------------------------------------------------------------------------------------


def _fit_args(model: Path, corpus: Path, root: Path, progress: Path) -> list[str]:
    slow = {
        "class_path": "_payloads_and_callbacks.SlowSteps",
        "init_args": {"progress": str(progress), "seconds": 0.3},
    }
    return [
        "fit",
        *tiny_fit_args(
            model,
            corpus,
            root,
            "--export.enabled=false",
            "--data.num_workers=2",
            f"--trainer.callbacks+={json.dumps(slow)}",
        ),
    ]


def _step(progress: Path) -> int:
    try:
        return json.loads(progress.read_text())["step"]
    except (OSError, ValueError):
        return -1


@pytest.mark.slow  # two tiny fits in fresh processes each: ~25 s on 2 cores
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_fit_stopped_while_training(signame, tiny_model_dir, corpus_file, tmp_path):
    signum, status = SIGNALS[signame]
    root, progress = tmp_path / "run", tmp_path / "progress.json"
    root.mkdir()
    args = _fit_args(tiny_model_dir, corpus_file, root, progress)
    before = digest(corpus_file)
    proc = CliProcess(args, cwd=root, env=ENV)
    output, processes = _stop(proc, signum, lambda: _step(progress) >= 2)

    assert proc.returncode == status, output[-3000:]
    assert len(processes) >= 2, processes  # the DataLoader workers
    assert not wait_gone(processes), f"processes outlived the stopped fit: {processes}"
    (line,) = error_lines(output)
    assert "Traceback" not in output, output[-3000:]
    checkpoints = sorted(root.rglob("last*.ckpt"))
    if signum == signal.SIGTERM:
        (checkpoint,) = checkpoints
        assert f"fit stopped by SIGTERM: saved {checkpoint} at step" in line, line
        assert "continue with --ckpt_path last" in line
        rerun_args = [*args, "--ckpt_path=last"]
    else:
        # Where it stopped and what to run next (it said "outside the training steps" before).
        assert line.startswith("mlm_adapt: error: fit stopped by SIGINT at step "), line
        assert "this stop wrote no checkpoint" in line and "run the same command again" in line, line
        assert not checkpoints
        rerun_args = args
    assert not [p for p in root.rglob("*.tmp")]  # nothing half-written
    assert digest(corpus_file) == before

    progress.unlink()
    rerun = run_command(rerun_args, cwd=root, env=ENV, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert _step(progress) == 6
    assert digest(corpus_file) == before


# --- locks whose owner is gone -------------------------------------------------------------------------


def test_a_dead_owners_lock_is_taken_over_with_one_line(tmp_path, capsys):
    from mlm_adapt.guard.locks import acquire, lock_path, release

    target = tmp_path / "prepared"
    lock = lock_path(target)
    # What a killed prepare leaves: its record, and no flock (the kernel dropped it with the process).
    lock.write_text(json.dumps({"format": "mlm_adapt lock", "pid": 4194303, "host": "node-gone"}) + "\n")
    acquire(target, "data.prepared_dir", str(target))
    try:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    finally:
        release(target)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mlm_adapt:")]
    assert lines == [
        f"mlm_adapt: taking over the lock {lock} of {target}: its owner (pid 4194303 on node-gone) is gone "
        "(killed before it released the lock)"
    ]
    assert not lock.exists()


LIVE_OWNER = """
import fcntl, json, os, socket, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
record = {"format": "mlm_adapt lock", "pid": os.getpid(), "host": socket.gethostname()}
os.write(fd, (json.dumps(record) + "\\n").encode())
print("locked", flush=True)
time.sleep(120)
"""


def test_a_live_owners_lock_is_still_refused(tmp_path, capsys):
    import socket
    import subprocess

    from mlm_adapt.errors import MLMAdaptError
    from mlm_adapt.guard.locks import acquire, lock_path

    target = tmp_path / "prepared"
    owner = subprocess.Popen(
        [sys.executable, "-c", LIVE_OWNER, str(lock_path(target))], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout.readline().strip() == "locked"
        with pytest.raises(MLMAdaptError, match=rf"pid {owner.pid} on {socket.gethostname()}"):
            acquire(target, "data.prepared_dir", str(target))
    finally:
        owner.kill()
        owner.wait()
    assert "taking over" not in capsys.readouterr().err


# --- exit 0 only when the output exists ----------------------------------------------------------------


def test_prepare_without_its_manifest_is_no_success(
    tiny_model_dir, corpus_file, tmp_path, capsys, monkeypatch
):
    """A prepare whose manifest was not written (a writer's bug, a file removed meanwhile) publishes nothing
    and does not report success: before, it printed "wrote" and exited 0, and ``fit`` then failed on it."""
    from mlm_adapt.cli.commands import main
    from mlm_adapt.data import prepared

    monkeypatch.setattr(prepared, "write_manifest", lambda directory, manifest: None)
    target = tmp_path / "prepared"
    with pytest.raises(SystemExit) as ended:
        main(prepare_args(tiny_model_dir, corpus_file, target, tmp_path / "cache"))
    assert ended.value.code == 2
    assert error_lines(capsys.readouterr().err) == [
        f"mlm_adapt: error: data.prepared_dir: {target}: manifest.json was not written, so nothing was "
        "published; run the same command again"
    ]
    assert not target.exists() and not list(tmp_path.glob(".prepared.staging*"))


def test_export_without_its_marker_is_no_success(trained_run, tmp_path, capsys, monkeypatch):
    from mlm_adapt.cli.commands import main
    from mlm_adapt.guard import outputs

    monkeypatch.setattr(outputs, "write_marker", lambda directory: None)
    out_dir = tmp_path / "exported"
    ckpt = trained_run / "checkpoints" / "last.ckpt"
    with pytest.raises(SystemExit) as ended:
        main(["export", f"--ckpt_path={ckpt}", f"--output_dir={out_dir}", "--progress_bar=false"])
    assert ended.value.code == 1
    assert error_lines(capsys.readouterr().err) == [
        f"mlm_adapt: error: export published {out_dir}, but its {MARKER} is missing; nothing there can be "
        "trusted: remove it and run the same command again"
    ]
