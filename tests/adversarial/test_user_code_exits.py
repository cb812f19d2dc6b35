"""``exit()``, ``KeyboardInterrupt`` or another ``BaseException`` raised by user code is a failure of it.

A class-path callback of ``trainer.callbacks`` and a registered downstream task type are user code, as a
segmenter is (``tests/data/test_prepare_stops.py``): what they raise ends the command in one line naming
the class and what it raised, with status 2 -- never status 0 (``exit(0)`` used to end ``fit`` as if it
had finished, with no message), never Lightning's Ctrl-C shutdown (``KeyboardInterrupt``, status 1).

What no handler sees is caught too: a segmenter that calls ``os._exit(0)`` (its first call runs in a
forked probe) or changes the working directory (changed back, refused) fails the command in one line.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import lightning as L
import pytest
from cli_process import prepare_args, run_command
from conftest import REPO, tiny_fit_args
from task_files import sentiment_files, task

from mlm_adapt.cli.commands import main
from mlm_adapt.downstream import tasks as task_loading
from mlm_adapt.downstream.types import TASK_TYPES
from mlm_adapt.downstream.types.sequence import SequenceClassification
from mlm_adapt.errors import Interrupted, MLMAdaptError, Stopped, user_code


class Odd(BaseException):
    """A BaseException that is neither SystemExit nor KeyboardInterrupt (what some libraries raise)."""


RAISED = {
    "exit0": (lambda: SystemExit(0), "called exit(0)"),
    "exit_none": (lambda: SystemExit(), "called exit(None)"),
    "keyboard_interrupt": (KeyboardInterrupt, "raised KeyboardInterrupt"),
    "base_exception": (lambda: Odd("the library gave up"), "raised Odd: the library gave up"),
}


class RaisingCallback(L.Callback):
    """Raises ``RAISED[what]`` at the end of the first training batch."""

    def __init__(self, what: str = "exit0"):
        self.what = what

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        raise RAISED[self.what][0]()


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mlm_adapt: error:")]


@pytest.mark.parametrize("what", list(RAISED))
def test_a_callback_that_exits_fails_fit(what, tiny_model_dir, corpus_file, tmp_path, capsys):
    spec = {"class_path": "test_user_code_exits.RaisingCallback", "init_args": {"what": what}}
    args = tiny_fit_args(
        tiny_model_dir,
        corpus_file,
        tmp_path,
        "--export.enabled=false",
        f"--trainer.callbacks+={json.dumps(spec)}",
    )
    previous = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as ended:
        main(["fit", *args])
    assert ended.value.code == 2
    assert signal.getsignal(signal.SIGINT) == previous
    err = capsys.readouterr().err
    lines = error_lines(err)
    assert lines == [
        "mlm_adapt: error: trainer.callbacks: test_user_code_exits.RaisingCallback.on_train_batch_end "
        f"{RAISED[what][1]}; a callback stops training with trainer.should_stop = True or raises an error, "
        "never exits"
    ], err[-3000:]
    assert "Traceback" not in err and "graceful shutdown" not in err


class ExitingReader(SequenceClassification):
    """A task type (registered in TASK_TYPES, as a new type is) whose reader, or a library it calls, exits."""

    name = "exiting"

    def read(self, table, task, index, files):
        raise SystemExit(0)


def test_a_task_reader_that_exits_fails_fit(tiny_model_dir, corpus_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(TASK_TYPES, "exiting", ExitingReader())
    entry = {**task("sentiment", sentiment_files(tmp_path)), "type": "exiting"}
    args = tiny_fit_args(
        tiny_model_dir,
        corpus_file,
        tmp_path,
        "--export.enabled=false",
        f"--downstream.tasks={json.dumps([entry])}",
    )
    with pytest.raises(SystemExit) as ended:
        main(["fit", *args])
    assert ended.value.code == 2
    lines = error_lines(capsys.readouterr().err)
    assert lines == [
        "mlm_adapt: error: downstream.tasks[0].type: exiting (test_user_code_exits.ExitingReader.read) "
        "called exit(0); a task type returns its examples or raises an error, never exits"
    ], lines


@pytest.mark.parametrize("what", ["keyboard_interrupt", "base_exception"])
def test_a_task_reader_that_raises_a_base_exception_is_its_failure(what, tmp_path, monkeypatch):
    class Raising(SequenceClassification):
        name = "raising"

        def read(self, table, task, index, files):
            raise RAISED[what][0]()

    monkeypatch.setitem(TASK_TYPES, "raising", Raising())
    entry = {**task("sentiment", sentiment_files(tmp_path)), "type": "raising"}
    with pytest.raises(
        MLMAdaptError, match=rf"downstream.tasks\[2\].type: raising \(.*\.Raising\.read\) {RAISED[what][1]};"
    ):
        task_loading.load_task(entry, 2, str(tmp_path / "cache"))


@pytest.mark.parametrize("stop", [Interrupted, lambda: Stopped(143)], ids=["ctrl_c", "sigterm"])
def test_a_stop_signal_passes_the_boundary_of_user_code(stop):
    """A signal's own exceptions, raised by the handlers wherever the process is, stay the stop they are."""
    with pytest.raises((Interrupted, Stopped)) as raised, user_code("x", "y"):
        raise stop()
    assert not isinstance(raised.value, MLMAdaptError)


HERE = Path(__file__).resolve().parent
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]),
}


class HardExitSegmenter:
    """A segmenter whose library ends the process where no handler sees it (``os._exit``)."""

    def segment(self, texts: list[str]) -> list[list[str]]:
        os._exit(0)


class ChdirSegmenter:
    """A segmenter that moves the process into ``to`` (as some wrappers do to find their model files)."""

    def __init__(self, to: str = "/") -> None:
        self.to = to

    def segment(self, texts: list[str]) -> list[list[str]]:
        os.chdir(self.to)
        return [list(text) for text in texts]


def _segmenter(name: str, **init_args) -> str:
    return "--data.segmenter=" + json.dumps(
        {"class_path": f"test_user_code_exits.{name}", "init_args": init_args}
    )


def test_a_segmenter_that_calls_os_exit_fails_prepare(tiny_model_dir, corpus_file, tmp_path):
    """It used to end prepare with status 0, nothing written, its lock and staging directory left."""
    target = tmp_path / "prepared"
    args = prepare_args(
        tiny_model_dir, corpus_file, target, tmp_path / "cache", _segmenter("HardExitSegmenter")
    )
    done = run_command(args, cwd=tmp_path, env=ENV)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = error_lines(done.stderr)
    assert (
        len(lines) == 1
        and "test_user_code_exits.HardExitSegmenter called os._exit(0) on the text" in lines[0]
    )
    assert "never end the process" in lines[0], lines
    assert not target.exists() and not (tmp_path / ".prepared.lock").exists()
    assert not list(tmp_path.glob(".prepared.staging*"))


def test_a_segmenter_that_changes_directory_fails_prepare_and_moves_nothing(
    tiny_model_dir, corpus_file, tmp_path
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    args = [
        "prepare", f"--model.model_name_or_path={tiny_model_dir}", "--model.max_seq_length=64",
        f"--data.train_files=[{corpus_file}]", "--data.prepared_dir=prepared", "--data.cache_dir=cache",
        "--trainer.enable_progress_bar=false", _segmenter("ChdirSegmenter", to=str(elsewhere)),
    ]  # fmt: skip
    done = run_command(args, cwd=tmp_path, env=ENV)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and f"ChdirSegmenter changed the working directory to {elsewhere}" in lines[0], (
        lines
    )
    assert list(elsewhere.iterdir()) == []
    assert not (tmp_path / "prepared").exists() and not list(tmp_path.glob(".prepared*"))


def test_a_segmenter_that_changes_directory_moves_no_run_output_of_fit(tiny_model_dir, corpus_file, tmp_path):
    """Logs, checkpoints, the cache and the export of a run given relative paths used to land in the
    directory the segmenter moved to."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    args = [
        "fit", *tiny_fit_args(tiny_model_dir, corpus_file, tmp_path),
        "--data.cache_dir=hf_cache", "--trainer.default_root_dir=run",
        _segmenter("ChdirSegmenter", to=str(elsewhere)),
    ]  # fmt: skip
    done = run_command(args, cwd=tmp_path, env=ENV)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and "ChdirSegmenter changed the working directory to" in lines[0], lines
    assert list(elsewhere.iterdir()) == []
