"""No command deletes what it did not write or runs code from a file it loads (real files, the real CLI)."""

from __future__ import annotations

import shutil
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from mlm_adapt.cli import main
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.export import HFExport


class CreatesMarker:
    """Unpickling this runs code: it creates ``path``."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return exec, (f"open({str(self.path)!r}, 'w').close()",)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def refused(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("mlm_adapt: error: ")
    return err


@pytest.fixture
def workdir(trained_run, tmp_path, monkeypatch) -> Path:
    """A user's working directory holding a checkpoint and other files; the current directory."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(trained_run / "checkpoints" / "last.ckpt", work / "last.ckpt")
    (work / "notes.md").write_text("my notes", encoding="utf-8")
    (work / "data").mkdir()
    (work / "data" / "corpus.txt").write_text("语料", encoding="utf-8")
    monkeypatch.chdir(work)
    return work


def test_export_to_the_current_directory_with_overwrite_deletes_nothing(workdir, capsys):
    before = snapshot(workdir)
    err = refused(["export", "--ckpt_path=last.ckpt", "--output_dir=.", "--overwrite"], capsys)
    assert "--output_dir: . is the current directory" in err
    assert snapshot(workdir) == before


def test_export_into_the_directory_holding_the_checkpoint_is_refused(workdir, tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.move(workdir / "last.ckpt", runs / "last.ckpt")
    before = snapshot(runs)
    err = refused(
        ["export", f"--ckpt_path={runs / 'last.ckpt'}", f"--output_dir={runs}", "--overwrite"], capsys
    )
    assert "contains the input" in err and "(--ckpt_path)" in err
    assert snapshot(runs) == before


def test_fit_export_into_the_run_directory_is_refused_before_training(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "demo"
    logger = CSVLogger(save_dir=run, name="csv")
    (run / "csv" / "version_0" / "checkpoints").mkdir(parents=True)
    (run / "csv" / "version_0" / "checkpoints" / "last.ckpt").write_bytes(b"weeks of training")
    trainer = L.Trainer(accelerator="cpu", logger=logger, enable_progress_bar=False, default_root_dir=run)
    before = snapshot(run)
    for output_dir, message in (
        (run, "is the run directory"),
        (run.parent, "contains the run directory"),
        (Path(logger.log_dir), "is the run directory"),
        (Path("."), "is the current directory"),
    ):
        with pytest.raises(MLMAdaptError, match=f"export.output_dir: .* {message}"):
            HFExport(output_dir=str(output_dir), overwrite=True).setup(trainer, L.LightningModule(), "fit")
    assert snapshot(run) == before


@pytest.mark.parametrize("command", ["export", "fill-mask"])
def test_crafted_checkpoint_runs_no_code(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "pwned"
    state = {"state_dict": {}, "hyper_parameters": {"model_name_or_path": CreatesMarker(marker)}}
    torch.save(state, tmp_path / "evil.ckpt")
    args = {
        "export": ["export", "--ckpt_path=evil.ckpt", "--output_dir=out"],
        "fill-mask": ["fill-mask", "--model=evil.ckpt", "北京[MASK]"],
    }[command]
    err = refused(args, capsys)
    assert "refusing to load evil.ckpt" in err and "exec" in err
    assert not marker.exists()


@pytest.mark.parametrize("found", [None, 1], ids=["no_format", "format_1"])
def test_a_checkpoint_of_another_format_is_refused_in_one_line(trained_run, found, tmp_path, capsys):
    from mlm_adapt.guard.loads import load_weights_only
    from mlm_adapt.model.module import CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_KEY

    checkpoint = load_weights_only(trained_run / "checkpoints" / "last.ckpt")
    assert checkpoint.pop(CHECKPOINT_FORMAT_KEY) == CHECKPOINT_FORMAT  # fit writes it
    if found is not None:
        checkpoint[CHECKPOINT_FORMAT_KEY] = found
    older = tmp_path / "older.ckpt"
    torch.save(checkpoint, older)
    out = tmp_path / "out"
    err = refused(["export", f"--ckpt_path={older}", f"--output_dir={out}"], capsys)
    written = "mlm_adapt 0.2 or earlier (or not by mlm_adapt)" if found is None else f"format {found}"
    assert err.startswith(
        f"mlm_adapt: error: --ckpt_path: {older} was written by {written}, and this mlm_adapt reads "
        f"checkpoint format {CHECKPOINT_FORMAT}; export it with the mlm_adapt that wrote it"
    ), err
    assert not out.exists()
