"""Outputs vs inputs: every path the tool writes (export, vocab, plot, fit's export) against what the run
reads, what is already there and what the system allows. Each refusal comes before any work, as one line,
with every file unchanged (sha256) and nothing of ours left behind."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightning as L
import pytest
from _output_workspace import (
    Refusal,
    Workspace,
    check_refused,
    leftovers,
    make_file,
    read_only_dir,
    tree_hashes,
    world,
    ws,
)
from conftest import run_main

from mlm_adapt.downstream import DownstreamEvaluation
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.export import HFExport
from mlm_adapt.guard.outputs import MARKER

__all__ = ["world", "ws"]  # the fixtures, used by name

EXPORT = ["export", "--ckpt_path=./run/last.ckpt"]
VOCAB = [
    "vocab",
    "--model.model_name_or_path=./base",
    "--model.new_tokens_file=./new_tokens.txt",
    "--data.train_files=[./corpus/corpus.txt]",
    "--data.segmentation.user_dict=./user_dict.txt",
    "--data.cache_dir=./hf_cache",
    "--min_count=2",
    "--top_k=5",
]
PLOT = ["plot", "./logs"]
PREPARE = ["prepare", "--model.model_name_or_path=./base", "--data.train_files=[./corpus/corpus.txt]"]


def _mount_point(name: str) -> Callable[..., None]:
    """``name`` reported as a mount point (a container volume), as ``os.path.ismount`` would."""

    def setup(ws: Workspace, mp: pytest.MonkeyPatch) -> None:
        (ws.root / name).mkdir()
        real_ismount, target = os.path.ismount, str(ws.root / name)
        mp.setattr(os.path, "ismount", lambda p: os.fspath(p) == target or real_ismount(p))

    return setup


REFUSALS = [
    # export: the base model, the checkpoint and what the checkpoint records are inputs
    Refusal(
        "export_onto_base_model_with_overwrite",
        [*EXPORT, "--output_dir=base", "--overwrite"],
        ("--output_dir: base", "is the input ./base", "model.model_name_or_path in the checkpoint"),
    ),
    Refusal(
        "export_inside_base_model", [*EXPORT, "--output_dir=base/adapted"], ("lies inside the input ./base",)
    ),
    Refusal(
        "export_into_corpus_dir",
        [*EXPORT, "--output_dir=corpus", "--overwrite"],
        ("contains the input ./corpus/corpus.txt (data.train_files in the checkpoint)",),
    ),
    Refusal(
        "export_onto_current_directory",
        [*EXPORT, "--output_dir=.", "--overwrite"],
        ("--output_dir: . is the current directory",),
    ),
    # export: what is there, and what the system allows
    Refusal(
        "export_second_without_overwrite",
        [*EXPORT, "--output_dir=exp"],
        ("--output_dir: exp is not empty; pass overwrite to replace the earlier export",),
    ),
    Refusal(
        "export_onto_user_directory",
        [*EXPORT, "--output_dir=thesis", "--overwrite"],
        ("thesis is not an mlm_adapt export",),
        setup=make_file("thesis/chapter1.tex"),
    ),
    Refusal(
        "export_onto_export_with_user_file",
        [*EXPORT, "--output_dir=exp", "--overwrite"],
        ("holds notes.txt, which no export wrote",),
        setup=make_file("exp/notes.txt"),
    ),
    Refusal(
        "export_onto_file",
        [*EXPORT, "--output_dir=notes.txt", "--overwrite"],
        ("notes.txt is a file; give a directory",),
        setup=make_file("notes.txt"),
    ),
    Refusal(
        "export_into_read_only_parent",
        [*EXPORT, "--output_dir=locked/model"],
        ("cannot write locked/model", "is read-only"),
        setup=read_only_dir("locked"),
    ),
    Refusal(
        "export_onto_mount_point",
        [*EXPORT, "--output_dir=volume", "--overwrite"],
        ("volume is a mount point", "volume/model"),
        setup=_mount_point("volume"),
    ),
    Refusal(
        "export_with_foreign_lock_file",
        [*EXPORT, "--output_dir=exp", "--overwrite"],
        ("is not an mlm_adapt lock file",),
        setup=make_file(".exp.lock", "my lock notes"),
    ),
    # vocab: its outputs against the corpus, dictionary, tokens file and model it reads
    Refusal(
        "vocab_tokens_onto_corpus",
        [*VOCAB, "--output_tokens=./corpus/corpus.txt"],
        ("--output_tokens: ./corpus/corpus.txt is the input", "(data.train_files)"),
    ),
    Refusal(
        "vocab_dict_onto_a_file_the_corpus_glob_matches",
        [*VOCAB, "--data.train_files=[./corpus/*.txt]", "--output_dict=corpus/corpus.txt"],
        ("--output_dict: corpus/corpus.txt is the input", "(data.train_files)"),
    ),
    Refusal(
        "vocab_dict_equals_tokens",
        [*VOCAB, "--output_dict=x.txt", "--output_tokens=./x.txt"],
        ("--output_tokens: ./x.txt is also --output_dict",),
    ),
    Refusal(
        "vocab_tokens_onto_a_plain_directory",
        [*VOCAB, "--output_tokens=somedir"],
        ("somedir is a directory; give a file path",),
        setup=lambda ws, mp: (ws.root / "somedir").mkdir(),
    ),
    # prepare: the directories it would write in are not made before the refusal
    Refusal(
        "prepare_inside_base_model",
        [*PREPARE, "--data.prepared_dir=base/prepared/reviews"],
        ("data.prepared_dir: ", "base/prepared/reviews lies inside the input ./base"),
    ),
    Refusal(
        "prepare_shard_inside_base_model",
        [*PREPARE, "--data.prepared_dir=base/new/prepared", "--shard=0/2"],
        ("data.prepared_dir:", "base/new/prepared", "lies inside the input ./base"),
    ),
    # plot
    Refusal(
        "plot_to_a_csv_file",
        [*PLOT, "--output=curves.csv"],
        ("--output: curves.csv: matplotlib cannot draw .csv files",),
    ),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c.name for c in REFUSALS])
def test_refused_before_any_work_changing_nothing(case: Refusal, ws: Workspace, capsys, monkeypatch):
    check_refused(case, ws, capsys, monkeypatch)


@dataclass(frozen=True)
class Success:
    """A command that must succeed: what it writes, and what must stay as it was."""

    name: str
    args: list[str]
    written: tuple[str, ...]
    kept: tuple[str, ...] = ("base", "corpus", "user_dict.txt", "new_tokens.txt", "run", "logs/metrics.csv")
    setup: Callable[..., Any] | None = None
    mode: int = 0o644  # of every file written, under umask 022


SUCCESSES = [
    Success("export_fresh_directory", [*EXPORT, "--output_dir=out/model"], ("out/model/model.safetensors",)),
    Success(
        "export_overwrite_earlier_export",
        [*EXPORT, "--output_dir=exp", "--overwrite"],
        ("exp/model.safetensors", "exp/README.md"),
    ),
    Success(
        "vocab_writes_both_files",
        [*VOCAB, "--output_dict=out/dict.txt", "--output_tokens=out/tokens.txt"],
        ("out/dict.txt", "out/tokens.txt"),
    ),
    Success("plot_default_output", PLOT, ("logs/curves.png",)),
    Success(
        "plot_replaces_its_own_png_keeping_its_mode",
        [*PLOT, "--output=curves.png"],
        ("curves.png",),
        mode=0o600,
        setup=make_file("curves.png", mode=0o600),
    ),
]


@pytest.mark.parametrize("case", SUCCESSES, ids=[c.name for c in SUCCESSES])
def test_written_atomically_with_umask_modes_and_inputs_kept(case: Success, ws: Workspace, capsys):
    if case.setup:
        case.setup(ws, None)
    kept = {name: tree_hashes(ws.root / name) for name in case.kept}
    old_umask = os.umask(0o022)
    try:
        code, out, err = run_main(case.args, capsys)
    finally:
        os.umask(old_umask)
    assert code == 0, err
    assert "wrote" in out
    for name in case.written:
        path = ws.root / name
        assert path.is_file()
        # Every file of a directory we wrote (model.safetensors was 0600 under umask 022), else ours alone.
        ours = path.parent.iterdir() if path.parent not in (ws.root, ws.root / "logs") else [path]
        modes = {p.name: p.stat().st_mode & 0o777 for p in ours if p.is_file()}
        assert set(modes.values()) == {case.mode}, modes
        if path.parent.name in ("model", "exp"):
            assert path.parent.stat().st_mode & 0o777 == 0o755 and (path.parent / MARKER).is_file()
    assert {name: tree_hashes(ws.root / name) for name in case.kept} == kept
    assert leftovers(ws.root.parent) == []


class _Module(L.LightningModule):
    def __init__(self, **hparams: Any):
        super().__init__()
        self.save_hyperparameters()


# name: (export.output_dir, what the line says); every case has every input below
FIT_CASES = {
    "onto_base_model": ("base", "export.output_dir: base is the input ./base (model.model_name_or_path)"),
    "into_task_dir": ("tasks", "(downstream.tasks[0].train_files)"),
    "into_resumed_checkpoint_dir": ("run", "(ckpt_path)"),
}


@pytest.mark.parametrize("case", list(FIT_CASES), ids=list(FIT_CASES))
def test_fit_export_refused_before_training(case, ws: Workspace):
    """``fit``'s export directory against the run's inputs, refused in ``HFExport.setup``."""
    output_dir, needle = FIT_CASES[case]
    (ws.root / "tasks").mkdir()
    (ws.root / "tasks" / "train.jsonl").write_text('{"text": "好", "label": 1}\n', encoding="utf-8")
    task = {"name": "t", "train_files": ["./tasks/train.jsonl"], "test_files": ["./tasks/train.jsonl"]}
    callbacks = [DownstreamEvaluation(tasks=[task])]
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, callbacks=callbacks)
    trainer.ckpt_path = str(ws.ckpt)
    module = _Module(model_name_or_path="./base", new_tokens_file="./new_tokens.txt")
    before = tree_hashes(ws.root.parent)
    with pytest.raises(MLMAdaptError) as raised:
        HFExport(output_dir=output_dir, overwrite=True).setup(trainer, module, "fit")
    assert tree_hashes(ws.root.parent) == before
    message = str(raised.value)
    assert "\n" not in message and ".staging-" not in message and needle in message, message
    assert leftovers(ws.root.parent) == []
