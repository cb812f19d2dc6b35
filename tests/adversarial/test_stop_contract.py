"""The stop contract of ``export``: stopped by SIGINT, SIGTERM or SIGKILL, it ends in one line (none for
SIGKILL) with ``128 + signal``, leaves no process behind, its inputs byte-identical, nothing half-written
where its output goes, and the same command then succeeds.

``export`` is held (a test-only hook, in the stopped process only: :func:`hold_in`) after the weights are
written into its staging directory, and after the export marker is written there, just before the
publishing rename. (test_signals stops ``fit``; tests/data/test_prepare_stops stops ``prepare``.)
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from cli_process import CliProcess, descendant_pids, prepare_args, run_command, wait_gone
from conftest import REPO

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


def digest(path: Path) -> str | dict[str, str]:
    """sha256 of a file, or of every file of a directory by name."""
    if path.is_dir():
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}
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
    "saving-weights": "transformers:PreTrainedModel.save_pretrained",
    # Everything is written and marked complete in the staging directory; the rename is next.
    "publishing": "mlm_adapt.guard.outputs:write_marker",
}
EXPORT_TABLE = [(phase, name) for phase in EXPORT_PHASES for name in SIGNALS]


@pytest.mark.parametrize(("phase", "signame"), EXPORT_TABLE, ids=[f"{p}-{s}" for p, s in EXPORT_TABLE])
def test_export_stopped_while_writing(phase, signame, trained_run, tmp_path):
    signum, status = SIGNALS[signame]
    ckpt = trained_run / "checkpoints" / "last.ckpt"
    before = digest(ckpt)
    out_dir = tmp_path / "exported"
    shutil.copytree(trained_run / "export", out_dir)  # the earlier export this one replaces
    earlier = digest(out_dir)
    args = ["export", f"--ckpt_path={ckpt}", f"--output_dir={out_dir}", "--overwrite", "--progress_bar=false"]
    proc = CliProcess([EXPORT_PHASES[phase], *args], cwd=tmp_path, env=ENV, code=HELD_COMMAND)
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
    assert digest(out_dir) == earlier  # the old state, never a mix of the two
    assert digest(ckpt) == before
    left_lock = (tmp_path / ".exported.lock").exists()
    assert left_lock == (signum == signal.SIGKILL)

    rerun = run_command(args, cwd=tmp_path, env=ENV, timeout=300)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert not (tmp_path / ".exported.lock").exists()  # a killed writer's lock: taken over, then removed
    assert (out_dir / MARKER).is_file() and (out_dir / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".exported")] == []
    assert digest(ckpt) == before


# --- exit 0 only when the output exists ----------------------------------------------------------------


def test_prepare_without_its_manifest_is_no_success(
    tiny_model_dir, corpus_file, tmp_path, capsys, monkeypatch
):
    """A prepare whose manifest was not written (a writer's bug, a file removed meanwhile) publishes nothing
    and does not report success: ``fit`` would fail on the directory later."""
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
