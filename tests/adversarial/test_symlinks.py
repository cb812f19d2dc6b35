"""Symlinks at, above and beside outputs: the policy of :mod:`mlm_adapt.guard.outputs` end to end.

An output path is resolved and its real target checked, locked and replaced (the link keeps pointing at the
new output); a link leading nowhere is refused before any work, naming the user's path; links beside an
output that look like ours (staging, lock) are never followed or removed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from _output_workspace import (
    Refusal,
    Workspace,
    check_refused,
    leftovers,
    make_file,
    make_link,
    run,
    tree_hashes,
    world,
    ws,
)

from mlm_adapt.guard.outputs import MARKER, Output, is_complete_export, write_text
from mlm_adapt.training.checkpoint_files import AtomicCheckpointIO

__all__ = ["world", "ws"]

EXPORT = ["export", "--ckpt_path=./run/last.ckpt"]
VOCAB = [
    "vocab",
    "--model.model_name_or_path=./base",
    "--data.train_files=[./corpus/corpus.txt]",
    "--data.cache_dir=./hf_cache",
    "--min_count=2",
    "--top_k=5",
]


def _loop(ws: Workspace, mp: pytest.MonkeyPatch) -> None:
    (ws.root / "a").symlink_to("b")
    (ws.root / "b").symlink_to("a")


def _victim_link(name: str) -> Callable[..., None]:
    """A link with one of our names (``name``) pointing at a user's file or directory."""

    def setup(ws: Workspace, mp: pytest.MonkeyPatch) -> None:
        (ws.root / "victim").mkdir()
        (ws.root / "victim" / "thesis.tex").write_text("years of work", encoding="utf-8")
        (ws.root / name).symlink_to("victim/thesis.tex" if name.endswith(".lock") else "victim")

    return setup


REFUSALS = [
    Refusal(
        "export_into_dangling_link",
        [*EXPORT, "--output_dir=out"],
        ("--output_dir: out is a symbolic link to nowhere/model, which does not exist",),
        setup=make_link("out", "nowhere/model"),
    ),
    Refusal(
        "export_below_dangling_directory_link",
        [*EXPORT, "--output_dir=deep/model"],
        ("--output_dir: deep/model:", "deep is a symbolic link to missing, which does not exist"),
        setup=make_link("deep", "missing"),
    ),
    Refusal(
        "export_into_link_loop", [*EXPORT, "--output_dir=a"], ("a is a symbolic link to b",), setup=_loop
    ),
    Refusal(
        "export_through_link_to_base_model",
        [*EXPORT, "--output_dir=alias", "--overwrite"],
        ("--output_dir: alias (->", "base) is the input ./base"),
        setup=make_link("alias", "base"),
    ),
    Refusal(
        "export_through_link_to_export_without_overwrite",
        [*EXPORT, "--output_dir=current"],
        ("--output_dir: current is not empty; pass overwrite",),
        setup=make_link("current", "exp"),
    ),
    Refusal(
        "export_through_link_to_cwd",
        [*EXPORT, "--output_dir=here", "--overwrite"],
        ("here is the current directory",),
        setup=make_link("here", "."),
    ),
    Refusal(
        "export_through_link_to_checkpoint_dir",
        [*EXPORT, "--output_dir=ckpts", "--overwrite"],
        ("contains the input ./run/last.ckpt (--ckpt_path)",),
        setup=make_link("ckpts", "run"),
    ),
    Refusal(
        "export_with_lock_file_linked_to_user_file",
        [*EXPORT, "--output_dir=exp", "--overwrite"],
        ("exp.lock (the lock file of exp) is a symbolic link",),
        setup=_victim_link(".exp.lock"),
    ),
    Refusal(
        "vocab_tokens_link_to_corpus",
        [*VOCAB, "--output_tokens=tokens.txt"],
        ("--output_tokens: tokens.txt (->", "is the input ./corpus/corpus.txt"),
        setup=make_link("tokens.txt", "corpus/corpus.txt"),
    ),
    Refusal(
        "vocab_dict_dangling_link",
        [*VOCAB, "--output_dict=dict.txt"],
        ("--output_dict: dict.txt is a symbolic link to gone/dict.txt",),
        setup=make_link("dict.txt", "gone/dict.txt"),
    ),
    Refusal(
        "plot_output_dangling_link",
        ["plot", "./logs", "--output=curves.png"],
        ("--output: curves.png is a symbolic link to",),
        setup=make_link("curves.png", "nowhere.png"),
    ),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c.name for c in REFUSALS])
def test_link_refused_before_any_work(case: Refusal, ws: Workspace, capsys, monkeypatch):
    check_refused(case, ws, capsys, monkeypatch)


@dataclass(frozen=True)
class Through:
    """An export through a link that must succeed: the link stays, its target holds the new export."""

    name: str
    link: str
    target: str
    args: list[str]
    setup: Callable[..., None] | None = None
    times: int = 1
    kept: tuple[str, ...] = ()


THROUGH = [
    Through(
        "export_through_link_to_earlier_export",
        "current",
        "exp",
        [*EXPORT, "--output_dir=current", "--overwrite"],
    ),
    Through(
        "export_twice_through_link",
        "current",
        "exp",
        [*EXPORT, "--output_dir=current", "--overwrite"],
        times=2,
    ),
    Through(
        "export_into_link_to_empty_dir",
        "empty_link",
        "empty",
        [*EXPORT, "--output_dir=empty_link"],
        setup=lambda ws, mp: (ws.root / "empty").mkdir(),
    ),
    Through(
        "export_through_link_in_parent",
        "models/current",
        "exp",
        [*EXPORT, "--output_dir=models/current", "--overwrite"],
        setup=lambda ws, mp: (ws.root / "models").mkdir(),
    ),
    Through(
        "export_beside_staging_named_link_to_user_dir",
        "current",
        "exp",
        [*EXPORT, "--output_dir=current", "--overwrite"],
        setup=_victim_link(".exp.staging-abc"),
        kept=("victim", ".exp.staging-abc"),
    ),
]


@pytest.mark.parametrize("case", THROUGH, ids=[c.name for c in THROUGH])
def test_export_through_link_replaces_the_real_target(case: Through, ws: Workspace, capsys, monkeypatch):
    if case.setup:
        case.setup(ws, monkeypatch)
    link = ws.root / case.link
    link.symlink_to(os.path.relpath(ws.root / case.target, link.parent))
    kept = {name: tree_hashes(ws.root / name) for name in ("base", "run", *case.kept)}
    for _ in range(case.times):
        code, out, err = run(case.args, capsys)
        assert code == 0, err  # was: OSError: Cannot call rmtree on a symbolic link
    assert link.is_symlink() and link.resolve() == (ws.root / case.target).resolve()
    real = ws.root / case.target
    assert is_complete_export(real) and (real / "model.safetensors").stat().st_size > 1000
    assert {name: tree_hashes(ws.root / name) for name in ("base", "run", *case.kept)} == kept
    assert leftovers(ws.root.parent) == []
    assert sorted(p.name for p in link.parent.iterdir() if p.name.startswith(f".{link.name}.")) == []


@dataclass(frozen=True)
class FileLink:
    """A single-file output through a link: written through it, or (checkpoints) replacing it."""

    name: str
    write: Callable[[Path], None]
    follows: bool


def _text(path: Path) -> None:
    write_text(Output(path, key="--output_tokens", directory=False), "新\n")


def _checkpoint(path: Path) -> None:
    AtomicCheckpointIO().save_checkpoint({"step": 3, "w": torch.ones(2)}, path)


FILE_LINKS = [
    FileLink("text_output_written_through_its_link", _text, follows=True),
    FileLink("checkpoint_link_replaced_not_written_through", _checkpoint, follows=False),
]


@pytest.mark.parametrize("case", FILE_LINKS, ids=[c.name for c in FILE_LINKS])
def test_single_file_outputs_and_links(case: FileLink, tmp_path):
    real = tmp_path / "store" / "epoch=1.ckpt"
    real.parent.mkdir()
    real.write_bytes(b"the best weights")
    link = tmp_path / "last.ckpt"
    link.symlink_to(real)
    case.write(link)
    if case.follows:
        assert link.is_symlink() and real.read_text(encoding="utf-8") == "新\n"
    else:
        assert not link.is_symlink() and real.read_bytes() == b"the best weights"
    assert leftovers(tmp_path) == [] and not list(tmp_path.glob(".*staging*"))


def test_marker_of_an_export_is_never_a_link_target(ws: Workspace, capsys):
    """A marker planted as a link into a user's file does not make a directory replaceable."""
    (ws.root / "mine").mkdir()
    make_file("mine/notes.md")(ws)
    (ws.root / "mine" / MARKER).symlink_to(ws.exp / MARKER)
    before = tree_hashes(ws.root / "mine")
    code, _, err = run([*EXPORT, "--output_dir=mine", "--overwrite"], capsys)
    assert code == 2 and "holds notes.md, which no export wrote" in err
    assert tree_hashes(ws.root / "mine") == before
