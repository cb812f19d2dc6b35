"""A short CLI fit of every model family: validation perplexity falls, the export reloads and reads well."""

from __future__ import annotations

import csv

import pytest
from conftest import run_cli, tiny_fit_args
from families import FAMILIES, family_dir, training_texts
from transformers import AutoModelForMaskedLM, AutoTokenizer

from mlm_adapt.cli.fill_mask import predict

BYTE_SYMBOLS = set("ĠĊĳĲĹĺĻļĽľĿŀŁł")  # GPT-2's stand-ins for bytes, never in readable Chinese text


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_fit_export_reload_and_fill_mask(family, tmp_path):
    corpus = tmp_path / "reviews.txt"
    corpus.write_text("\n".join(training_texts()) + "\n", encoding="utf-8")
    args = tiny_fit_args(
        family_dir(family),
        corpus,
        tmp_path,
        "--model.optimizer=torch.optim.AdamW",
        "--model.optimizer.lr=0.01",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={tmp_path}",
        "--trainer.enable_checkpointing=false",
        f"--export.output_dir={tmp_path / 'export'}",
    )
    result = run_cli("fit", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader(next(tmp_path.rglob("metrics.csv")).open()))
    val = [(int(r["step"]), float(r["val/perplexity"])) for r in rows if r.get("val/perplexity")]
    assert val[0][0] == 0 and val[-1][0] == 6  # the step-0 baseline, then the final weights
    assert val[-1][1] < val[0][1]

    model = AutoModelForMaskedLM.from_pretrained(tmp_path / "export").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "export")
    assert type(model).__name__ == type(AutoModelForMaskedLM.from_pretrained(family_dir(family))).__name__
    mask = tokenizer.mask_token
    predictions, fillings = predict(model, tokenizer, f"这本书{mask}{mask}好，值得一看", top_k=3)
    assert len(predictions) == 2 and len(fillings) == 1
    shown = "".join(t for p in predictions for t, _ in p.candidates) + fillings[0].word + fillings[0].text
    assert not BYTE_SYMBOLS & set(shown)
    assert fillings[0].text.startswith("这本书") and "值得一看" in fillings[0].text
