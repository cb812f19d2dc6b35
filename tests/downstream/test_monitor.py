"""``export.monitor`` picks the exported weights by any logged metric (with ``export.mode``), e.g. a
downstream score; and the ``downstream:`` group of the CLI end to end."""

from __future__ import annotations

import csv
import json

import lightning as L
import pytest
import torch
from conftest import make_datamodule, quiet_trainer, run_cli, tiny_fit_args
from task_files import sentiment_files, task
from transformers import AutoModelForMaskedLM

from mlm_adapt.cli import main
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.export import HFExport
from mlm_adapt.model import MaskedLMModule
from mlm_adapt.training import BeforeAfterValidation


class ScriptedScore(L.Callback):
    """Logs ``custom/score`` = the next of ``values`` at each validation, and keeps each step's weights."""

    def __init__(self, values: list[float]):
        self.values = list(values)
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_validation_epoch_end(self, trainer, pl_module):
        pl_module.log("custom/score", self.values.pop(0))
        self.weights[trainer.global_step] = {k: v.clone() for k, v in pl_module.model.state_dict().items()}


@pytest.mark.parametrize(("mode", "best_step"), [("max", 2), ("min", 4)])
def test_export_keeps_the_weights_of_the_best_logged_value(
    tiny_model_dir, corpus_file, tmp_path, mode, best_step
):
    scores = ScriptedScore([0.2, 0.9, 0.1, 0.5])  # validations at steps 0 (baseline), 2, 4, 6
    export = HFExport(output_dir=str(tmp_path / "out"), monitor="custom/score", mode=mode)
    trainer = quiet_trainer(
        max_steps=6,
        val_check_interval=2,
        limit_val_batches=1,
        default_root_dir=tmp_path,
        callbacks=[scores, export, BeforeAfterValidation()],
    )
    module = MaskedLMModule(str(tiny_model_dir), max_seq_length=64)
    module.configure_optimizers = lambda: torch.optim.AdamW(module.parameters(), lr=1e-2)
    trainer.fit(module, make_datamodule(tiny_model_dir, corpus_file, tmp_path, validation_split=0.1))
    assert sorted(scores.weights) == [0, 2, 4, 6]
    exported = AutoModelForMaskedLM.from_pretrained(tmp_path / "out").state_dict()
    expected = scores.weights[best_step]
    assert all(torch.equal(exported[k], expected[k]) for k in exported)
    emb = "bert.embeddings.word_embeddings.weight"
    assert len({scores.weights[s][emb].sum().item() for s in (0, 2, 4, 6)}) == 4  # the weights did move
    card = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    assert f"best weights by custom/score ({mode}" in card and f"at step {best_step}" in card


def test_export_mode_must_agree_with_the_checkpoint_callback(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoint = ModelCheckpoint(monitor="downstream/s/accuracy", mode="min")
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, callbacks=[checkpoint])
    export = HFExport(output_dir=str(tmp_path / "o"), monitor="downstream/s/accuracy", mode="max")
    with pytest.raises(MLMAdaptError, match="export.mode='max' but the ModelCheckpoint"):
        export.setup(trainer, L.LightningModule(), "fit")


@pytest.mark.slow
def test_cli_downstream_group_logs_step_0_and_validations_and_exports_by_task_score(
    tiny_model_dir, corpus_file, tmp_path
):
    tasks = [task("sentiment", sentiment_files(tmp_path))]
    result = run_cli(
        "fit",
        *tiny_fit_args(
            tiny_model_dir,
            corpus_file,
            tmp_path,
            "--trainer.val_check_interval=3",
            "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
            f"--trainer.logger.save_dir={tmp_path}",
            f"--downstream.tasks={json.dumps(tasks)}",
            "--export.monitor=downstream/sentiment/macro_f1",
            "--export.mode=max",
            f"--export.output_dir={tmp_path / 'export'}",
        ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader(next(tmp_path.rglob("metrics.csv")).open()))
    logged = [int(r["step"]) for r in rows if r.get("downstream/sentiment/accuracy")]
    val = [int(r["step"]) for r in rows if r.get("val/loss")]
    assert logged[0] == 0 and len(logged) == len(val) == 3  # step 0, after step 3, after step 6
    assert all(r.get("downstream/time_s") for r in rows if r.get("downstream/sentiment/accuracy"))
    card = (tmp_path / "export" / "README.md").read_text(encoding="utf-8")
    assert "best weights by downstream/sentiment/macro_f1 (max" in card


def test_cli_reports_a_bad_task_file_in_one_line(tiny_model_dir, corpus_file, tmp_path, capsys):
    # In-process: the error path needs no separate interpreter (tests/cli/test_cli_errors.py runs one).
    tasks = [{"name": "s", "train_files": [str(tmp_path / "missing.jsonl")], "test_files": ["x.jsonl"]}]
    with pytest.raises(SystemExit) as exit_info:
        args = tiny_fit_args(tiny_model_dir, corpus_file, tmp_path, f"--downstream.tasks={json.dumps(tasks)}")
        main(["fit", *args])
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith("mlm_adapt: error: downstream.tasks[0].train_files: ")
    )
