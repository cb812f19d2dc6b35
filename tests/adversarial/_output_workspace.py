"""Shared pieces of the output adversarial suite (test_outputs, test_symlinks, test_concurrency).

``world``: a base model that is itself an earlier export (``base``), a corpus, a user dictionary, a
new-tokens file, a checkpoint recording them, an earlier export (``exp``) and a CSV log, built once per
session; each case gets its own copy of the paths it may touch (``ws``) and the user's current directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import run_main

from mlm_adapt.guard.locks import STAGING_MARKER
from mlm_adapt.guard.outputs import write_marker
from mlm_adapt.model import MaskedLMModule
from mlm_adapt.model.module import CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_KEY


@dataclass
class Workspace:
    """The paths of one case: ``root`` is the current directory; everything lies below it."""

    root: Path
    base: Path
    ckpt: Path
    exp: Path


def tree_hashes(path: Path) -> dict[str, str]:
    """sha256 of every file under ``path`` (links as their target text) and every directory (``dir``), by
    relative path; one file too."""
    if not os.path.lexists(path):
        return {}
    if path.is_symlink():
        return {".": "link:" + os.readlink(path)}
    if path.is_file():
        return {".": hashlib.sha256(path.read_bytes()).hexdigest()}
    found = {}
    for root, dirs, files in os.walk(path):
        found.update({str((Path(root) / d).relative_to(path)): "dir" for d in dirs})
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            item = Path(root) / name
            rel = str(item.relative_to(path))
            if item.is_symlink():
                found[rel] = "link:" + os.readlink(item)
            else:
                found[rel] = hashlib.sha256(item.read_bytes()).hexdigest()
    return found


def leftovers(directory: Path) -> list[str]:
    """Staging directories (with our marker) and lock files (with our record) anywhere below ``directory``."""
    found = []
    for root, dirs, files in os.walk(directory):
        marked = [d for d in dirs if os.path.isfile(os.path.join(root, d, STAGING_MARKER))]
        found += [os.path.join(root, d) for d in marked]
        locks = [os.path.join(root, f) for f in files if f.endswith(".lock")]
        found += [f for f in locks if "mlm_adapt lock" in Path(f).read_text(errors="replace")]
    return sorted(found)


def assert_one_line(err: str, *needles: str) -> None:
    """Exactly one ``mlm_adapt: error: …`` line on stderr, holding every needle."""
    # Progress bars of work done before a refusal at publish time (tqdm redraws with \r) are not errors.
    lines = [line.rsplit("\r", 1)[-1] for line in err.splitlines()]
    lines = [line for line in lines if line.strip() and not re.search(r"\d+%\|", line)]
    assert len(lines) == 1 and lines[0].startswith("mlm_adapt: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert ".staging-" not in lines[0]


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """Makes ``path`` read-only even for root (immutable flag), else by its mode; skips if neither holds."""
    mode = path.stat().st_mode
    os.chmod(path, stat.S_IMODE(mode) & ~0o222)
    immutable = False
    if os.geteuid() == 0:
        immutable = subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    try:
        if not immutable and os.access(path, os.W_OK):
            pytest.skip("cannot make a path read-only here")
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        os.chmod(path, stat.S_IMODE(mode))


@pytest.fixture(scope="session")
def world(tmp_path_factory, tiny_model_dir, review_texts) -> Path:
    """The session's originals (copied per case by ``ws``); the checkpoint records paths relative to it."""
    root = tmp_path_factory.mktemp("output_world")
    base = root / "base"
    shutil.copytree(tiny_model_dir, base)
    write_marker(base)  # the run started from an earlier export: overwrite alone would replace it
    (root / "corpus").mkdir()
    (root / "corpus" / "corpus.txt").write_text("\n".join(review_texts[:200]) + "\n", encoding="utf-8")
    (root / "user_dict.txt").write_text("好评如潮 10 n\n", encoding="utf-8")
    (root / "new_tokens.txt").write_text("龘\n", encoding="utf-8")
    exp = root / "exp"
    exp.mkdir()
    for name, text in {"config.json": "{}", "model.safetensors": "w", "README.md": "# card"}.items():
        (exp / name).write_text(text, encoding="utf-8")
    write_marker(exp)
    (root / "logs").mkdir()
    rows = ["step,train/loss,val/loss"] + [f"{s},{5 - s * 0.1:.2f},{5.2 - s * 0.1:.2f}" for s in range(1, 8)]
    (root / "logs" / "metrics.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    module = MaskedLMModule(model_name_or_path=str(base), max_seq_length=64, pretrained=False)
    (root / "run").mkdir()
    torch.save(
        {
            "state_dict": module.state_dict(),
            "hyper_parameters": {"model_name_or_path": "./base", "max_seq_length": 64},
            "datamodule_hyper_parameters": {
                "train_files": ["./corpus/corpus.txt"],
                "user_dict": "./user_dict.txt",
                "tokenizer_name_or_path": "./base",
            },
            "global_step": 0,
            "epoch": 0,
            CHECKPOINT_FORMAT_KEY: CHECKPOINT_FORMAT,
        },
        root / "run" / "last.ckpt",
    )
    return root


@pytest.fixture
def ws(world, tmp_path, monkeypatch) -> Workspace:
    """A fresh copy of ``world`` under ``tmp_path/work``, the current directory."""
    work = tmp_path / "work"
    shutil.copytree(world, work, symlinks=True)
    monkeypatch.chdir(work)
    return Workspace(root=work, base=work / "base", ckpt=work / "run" / "last.ckpt", exp=work / "exp")


@dataclass(frozen=True)
class Refusal:
    """A command that must refuse: its arguments, what the one line says, and what to set up first."""

    name: str
    args: list[str]
    needles: tuple[str, ...]
    setup: Callable[[Workspace, pytest.MonkeyPatch], Any] | None = None  # may return a context manager


def make_link(name: str, to: str) -> Callable[..., None]:
    return lambda ws, mp=None: (ws.root / name).symlink_to(to)


def make_file(name: str, text: str = "mine", mode: int | None = None) -> Callable[..., None]:
    """A file ``name`` of the user's (its directories made), with ``mode`` if given."""

    def make(ws: Workspace, mp: pytest.MonkeyPatch | None = None) -> None:
        (ws.root / name).parent.mkdir(parents=True, exist_ok=True)
        (ws.root / name).write_text(text, encoding="utf-8")
        if mode is not None:
            os.chmod(ws.root / name, mode)

    return make


def read_only_dir(name: str) -> Callable[..., Any]:
    """A new directory ``name``, read-only while the command runs."""

    def setup(ws: Workspace, mp: pytest.MonkeyPatch | None = None) -> Any:
        (ws.root / name).mkdir()
        return read_only(ws.root / name)

    return setup


def check_refused(case: Refusal, ws: Workspace, capsys, monkeypatch) -> None:
    """Runs a refused case: exit status, one line, every file unchanged, nothing of ours left."""
    held = case.setup(ws, monkeypatch) if case.setup else None
    with held if isinstance(held, contextlib.AbstractContextManager) else contextlib.nullcontext():
        before = tree_hashes(ws.root.parent)
        code, out, err = run_main(case.args, capsys)
        after = tree_hashes(ws.root.parent)
    assert code == 2, err
    assert_one_line(err, *case.needles)
    assert after == before
    assert leftovers(ws.root.parent) == []
    assert out.strip() == ""  # refused before any work: no report, no "wrote"
