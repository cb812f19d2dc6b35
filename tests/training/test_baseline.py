"""BeforeAfterValidation: the step-0 baseline and the final validation inside ``Trainer.fit``."""

from __future__ import annotations

import csv

import lightning as L
from conftest import make_datamodule, quiet_trainer
from lightning.pytorch.loggers import CSVLogger

from mlm_adapt import MaskedLMModule
from mlm_adapt.training import BeforeAfterValidation


def test_python_api_fit_gets_baseline_final_validation_and_table(
    tiny_model_dir, corpus_file, tmp_path, capsys
):
    L.seed_everything(0)
    model = MaskedLMModule(str(tiny_model_dir), max_seq_length=64)
    data = make_datamodule(tiny_model_dir, corpus_file, tmp_path, validation_split=0.1)
    logger = CSVLogger(tmp_path / "logs", name="run")
    trainer = quiet_trainer(
        max_steps=5,
        val_check_interval=3,
        limit_val_batches=2,
        logger=logger,
        callbacks=[BeforeAfterValidation()],
    )
    trainer.fit(model, datamodule=data)
    assert set(model.baseline_metrics) >= {"val/loss", "val/accuracy", "val/perplexity"}
    with open(f"{logger.log_dir}/metrics.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    validated_at = sorted({int(r["step"]) for r in rows if r.get("val/loss")})
    # The baseline (0), Lightning's own validation after the 3rd batch (which it labels with the 2 optimizer
    # steps taken before that batch's) and the final weights after 5 steps (not validated otherwise).
    assert validated_at == [0, 2, 5]
    step0 = next(float(r["val/loss"]) for r in rows if r.get("val/loss") and int(r["step"]) == 0)
    assert step0 == model.baseline_metrics["val/loss"]
    out = capsys.readouterr().out
    assert "before" in out and "after" in out and f"{step0:.4f}" in out
