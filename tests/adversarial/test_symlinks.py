"""Symlinks at, above and beside outputs: the policy of :mod:`mlm_adapt.guard.outputs` end to end.

An output path is resolved and its real target checked, locked and replaced (the link keeps pointing at the
new output); a link leading nowhere is refused before any work, naming the user's path; links beside an
output that look like ours (staging, lock) are never followed or removed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from _output_workspace import (
    Refusal,
    Workspace,
    check_refused,
    leftovers,
    make_file,
    make_link,
    tree_hashes,
    world,
    ws,
)
from conftest import run_main

from mlm_adapt.guard.outputs import MARKER, Output, is_complete_export, write_text
from mlm_adapt.training.checkpoint_files import AtomicCheckpointIO

__all__ = ["world", "ws"]

EXPORT = ["export", "--ckpt_path=./run/last.ckpt"]


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
        "export_into_link_loop", [*EXPORT, "--output_dir=a"], ("a is a symbolic link to b",), setup=_loop
    ),
    Refusal(
        "export_through_link_to_base_model",
        [*EXPORT, "--output_dir=alias", "--overwrite"],
        ("--output_dir: alias (->", "base) is the input ./base"),
        setup=make_link("alias", "base"),
    ),
    Refusal(
        "export_with_lock_file_linked_to_user_file",
        [*EXPORT, "--output_dir=exp", "--overwrite"],
        (".exp.lock exists and is not an mlm_adapt lock file; move it away to write exp",),
        setup=_victim_link(".exp.lock"),
    ),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c.name for c in REFUSALS])
def test_link_refused_before_any_work(case: Refusal, ws: Workspace, capsys, monkeypatch):
    check_refused(case, ws, capsys, monkeypatch)


@pytest.mark.parametrize("beside", [False, True], ids=["plain", "beside_a_staging_named_link_to_user_dir"])
def test_export_through_link_replaces_the_real_target(beside, ws: Workspace, capsys, monkeypatch):
    kept = ["base", "run"]
    if beside:
        _victim_link(".exp.staging-abc")(ws, monkeypatch)
        kept += ["victim", ".exp.staging-abc"]
    link = ws.root / "current"
    link.symlink_to("exp")
    before = {name: tree_hashes(ws.root / name) for name in kept}
    code, _, err = run_main([*EXPORT, "--output_dir=current", "--overwrite"], capsys)
    assert code == 0, err
    assert link.is_symlink() and link.resolve() == ws.exp.resolve()
    assert is_complete_export(ws.exp) and (ws.exp / "model.safetensors").stat().st_size > 1000
    assert {name: tree_hashes(ws.root / name) for name in kept} == before
    assert leftovers(ws.root.parent) == []
    assert sorted(p.name for p in link.parent.iterdir() if p.name.startswith(f".{link.name}.")) == []


@pytest.mark.parametrize(
    "text", [True, False], ids=["text_written_through_its_link", "checkpoint_replaces_it"]
)
def test_single_file_outputs_and_links(text, tmp_path):
    real = tmp_path / "store" / "epoch=1.ckpt"
    real.parent.mkdir()
    real.write_bytes(b"the best weights")
    link = tmp_path / "last.ckpt"
    link.symlink_to(real)
    if text:
        write_text(Output(link, key="--output_tokens", directory=False), "新\n")
        assert link.is_symlink() and real.read_text(encoding="utf-8") == "新\n"
    else:  # Lightning's save_last: link points last.ckpt at the best one, which must survive
        AtomicCheckpointIO().save_checkpoint({"step": 3, "w": torch.ones(2)}, link)
        assert not link.is_symlink() and real.read_bytes() == b"the best weights"
    assert leftovers(tmp_path) == [] and not list(tmp_path.glob(".*staging*"))


def test_marker_of_an_export_is_never_a_link_target(ws: Workspace, capsys):
    """A marker planted as a link into a user's file does not make a directory replaceable."""
    (ws.root / "mine").mkdir()
    make_file("mine/notes.md")(ws)
    (ws.root / "mine" / MARKER).symlink_to(ws.exp / MARKER)
    before = tree_hashes(ws.root / "mine")
    code, _, err = run_main([*EXPORT, "--output_dir=mine", "--overwrite"], capsys)
    assert code == 2 and "holds notes.md, which no export wrote" in err
    assert tree_hashes(ws.root / "mine") == before
