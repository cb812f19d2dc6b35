"""The export directory rules: what overwrite may replace, the atomic swap, leftovers of killed runs."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from cli_process import run_command

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.outputs import MARKER, Output, check_output, is_complete_export, write_directory

REPO = Path(__file__).resolve().parents[2]
EXPORT_FILES = {"config.json": "{}", "model.safetensors": "weights", "README.md": "# card"}


def write_export(target: Path, tag: str, overwrite: bool = True) -> None:
    """An export as write_export lays it out: files staged, then published with the marker."""
    with write_directory(Output(target, overwrite=overwrite)) as staging:
        for name, text in EXPORT_FILES.items():
            (staging / name).write_text(f"{text} {tag}", encoding="utf-8")


def check_output_dir(output_dir, overwrite, key="--output_dir", *, run_dirs=(), inputs=None) -> Path:
    return check_output(Output(output_dir, key, overwrite=overwrite, run_dirs=run_dirs, inputs=inputs or {}))


def contents(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in directory.iterdir() if p.is_file()}


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_export_writes_marker_and_replaces_only_an_earlier_export(tmp_path):
    target = tmp_path / "export"
    write_export(target, "old")
    assert is_complete_export(target) and (target / MARKER).is_file()
    with pytest.raises(MLMAdaptError, match="not empty; pass overwrite to replace the earlier export"):
        check_output_dir(target, overwrite=False)
    assert check_output_dir(target, overwrite=True) == target.resolve()
    write_export(target, "new")
    assert contents(target)["config.json"] == "{} new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no staging or backup left


def test_overwrite_refuses_a_directory_that_is_not_an_export(tmp_path):
    user_dir = tmp_path / "thesis"
    user_dir.mkdir()
    (user_dir / "chapter1.tex").write_text("years of work", encoding="utf-8")
    before = snapshot(user_dir)
    with pytest.raises(MLMAdaptError, match=r"is not an mlm_adapt export .*choose another directory"):
        check_output_dir(user_dir, overwrite=True, key="export.output_dir")
    assert snapshot(user_dir) == before


def test_overwrite_refuses_an_export_holding_a_foreign_file(tmp_path):
    target = tmp_path / "export"
    write_export(target, "old")
    (target / "notes.txt").write_text("mine", encoding="utf-8")
    (target / ".git").mkdir()
    with pytest.raises(MLMAdaptError, match=r"holds \.git, notes\.txt, which no export wrote"):
        check_output_dir(target, overwrite=True)
    assert (target / "notes.txt").read_text(encoding="utf-8") == "mine"


def test_refuses_the_current_directory_and_its_ancestors(tmp_path, monkeypatch):
    work = tmp_path / "project"
    work.mkdir()
    (work / "data.txt").write_text("keep", encoding="utf-8")
    monkeypatch.chdir(work)
    with pytest.raises(MLMAdaptError, match="is the current directory"):
        check_output_dir(".", overwrite=True)
    with pytest.raises(MLMAdaptError, match="contains the current directory"):
        check_output_dir(tmp_path, overwrite=True)
    with pytest.raises(MLMAdaptError, match="is the current directory"):
        check_output_dir(work / ".." / "project", overwrite=False)  # the same directory, spelled otherwise
    assert (work / "data.txt").read_text(encoding="utf-8") == "keep"


def test_refuses_the_run_directory_and_its_ancestors_but_not_a_subdirectory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "demo" / "csv" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    with pytest.raises(MLMAdaptError, match=r"is the run directory \(checkpoints and logs\)"):
        check_output_dir(run, overwrite=True, key="export.output_dir", run_dirs=[run])
    with pytest.raises(MLMAdaptError, match="contains the run directory"):
        check_output_dir(tmp_path / "runs" / "demo", overwrite=True, run_dirs=[run])
    assert check_output_dir(run / "hf_model", overwrite=True, run_dirs=[run]) == (run / "hf_model")


def test_refuses_a_directory_holding_an_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "ckpts"
    runs.mkdir()
    ckpt = runs / "last.ckpt"
    ckpt.write_bytes(b"checkpoint")
    with pytest.raises(MLMAdaptError, match=r"contains the input .*last\.ckpt \(--ckpt_path\)"):
        check_output_dir(runs, overwrite=True, inputs={"--ckpt_path": [ckpt]})
    corpus = tmp_path / "corpus"
    with pytest.raises(MLMAdaptError, match=r"contains the input .*\(data\.train_files\)"):
        check_output_dir(corpus, overwrite=True, inputs={"data.train_files": [f"{corpus}/*.txt"]})
    assert ckpt.read_bytes() == b"checkpoint"


KILL_BETWEEN_RENAMES = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from mlm_adapt.guard import outputs

    target = Path(sys.argv[1])
    real_rename = os.rename
    calls = []

    def rename_then_die(src, dst):
        real_rename(src, dst)
        calls.append((src, dst))
        if len(calls) == 1:  # the old export is now the backup; the new one is not yet in place
            os.kill(os.getpid(), signal.SIGKILL)

    with outputs.write_directory(outputs.Output(target, overwrite=True)) as staging:
        for name in ("config.json", "model.safetensors", "README.md"):
            (staging / name).write_text(name + " new", encoding="utf-8")
        outputs.os.rename = rename_then_die
    """
)


def test_kill_between_the_two_renames_keeps_an_export_complete(tmp_path):
    target = tmp_path / "export"
    write_export(target, "old")
    old = snapshot(target)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = run_command([str(target)], env=env, code=KILL_BETWEEN_RENAMES)
    assert result.returncode == -9, result.stderr  # really killed, between the renames
    assert not target.exists()
    (staging,) = tmp_path.glob(".export.staging-*")
    assert snapshot(staging / "old") == old  # the old export is complete, only renamed
    assert is_complete_export(staging / "new")  # and so is the new one

    with pytest.raises(MLMAdaptError, match="not empty"):  # what the next export does first: repair, check
        check_output_dir(target, overwrite=False)
    assert snapshot(target) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_export_directory_and_files_follow_the_umask(tmp_path):
    old_umask = os.umask(0o022)
    try:
        write_export(tmp_path / "export", "new")
    finally:
        os.umask(old_umask)
    assert (tmp_path / "export").stat().st_mode & 0o777 == 0o755
    assert {p.stat().st_mode & 0o777 for p in (tmp_path / "export").iterdir()} == {0o644}
