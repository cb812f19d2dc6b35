"""The model card's before/after table: every validation set and every downstream task."""

from __future__ import annotations

from mlm_adapt.export.card import ExportInfo, render_model_card


def _table_rows(card_text: str) -> dict[str, list[str]]:
    rows = {}
    for line in card_text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and "/" in cells[0]:
            rows[cells[0]] = cells[1:]
    return rows


def test_card_has_a_row_for_every_set_and_task():
    before = {"val/loss": 8.3, "val_general/loss": 8.1, "downstream/sentiment/accuracy": 0.66}
    after = {
        "val/loss": 5.7,
        "val_general/loss": 7.9,
        "downstream/sentiment/accuracy": 0.7,
        "downstream/ner/f1": 0.3,
    }
    info = ExportInfo(
        model_hparams={"model_name_or_path": "tiny"},
        data_hparams={
            "validation_files": {"domain": None, "general": ["general.txt"]},
            "validation_split": 0.02,
        },
        baseline_metrics=before,
        final_metrics=after,
        final_metrics_step=900,
    )
    text = str(render_model_card(info, title="demo"))
    rows = _table_rows(text)
    assert list(rows) == [
        "val/loss",
        "val_general/loss",
        "downstream/sentiment/accuracy",
        "downstream/ner/f1",
    ]
    assert rows["val_general/loss"] == ["8.1000", "7.9000"]
    assert rows["downstream/ner/f1"] == ["n/a", "0.3000"]
    # The card says which data each set is.
    assert "`val/*`: domain" in text and "`val_general/*`: general" in text and "general.txt" in text
