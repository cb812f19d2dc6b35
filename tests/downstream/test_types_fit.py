"""Every task type inside a real fit, by both methods: scores at step 0 and after training, the
``every_n_validations`` schedule, example bounds, and one progress line per phase without a progress bar."""

from __future__ import annotations

import logging

import pytest
from conftest import make_datamodule, quiet_trainer
from task_files import all_type_tasks

from mlm_adapt import MaskedLMModule
from mlm_adapt.data.progress import Progress
from mlm_adapt.downstream import DownstreamEvaluation
from mlm_adapt.errors import MLMAdaptError

METRICS = {
    "sentiment": ("accuracy", "macro_f1"),
    "pairs": ("accuracy", "macro_f1"),
    "ner": ("f1", "accuracy"),
    "scores": ("pearson", "spearman"),
}


def _fit(tiny_model_dir, corpus_file, tmp_path, callback, caplog, **trainer_args):
    module = MaskedLMModule(str(tiny_model_dir), max_seq_length=64)
    datamodule = make_datamodule(tiny_model_dir, corpus_file, tmp_path, validation_split=0.1)
    args = dict(max_steps=5, val_check_interval=1, limit_val_batches=1, callbacks=[callback])
    trainer = quiet_trainer(**{**args, **trainer_args})
    # conftest makes Lightning's logger propagate to the root logger, where caplog listens.
    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        trainer.fit(module, datamodule=datamodule)
    return trainer


def test_probe_of_every_type_every_second_validation_with_bounds_and_progress_lines(
    tiny_model_dir, corpus_file, tmp_path, caplog
):
    callback = DownstreamEvaluation(
        tasks=all_type_tasks(tmp_path, n=40),
        max_train_examples=30,
        max_test_examples=16,
        every_n_validations=2,
    )
    _fit(tiny_model_dir, corpus_file, tmp_path, callback, caplog)
    # Step 0, then validations 2 and 4 of 5 (steps 2, 4), then the final weights at the end of fit.
    assert sorted(callback.results) == [0, 2, 4, 5]
    for step in (0, 5):
        for name, metrics in METRICS.items():
            for metric in metrics:
                value = callback.results[step][f"downstream/{name}/{metric}"]
                assert -1 <= value <= 1 and f"downstream/{name}/{metric}_std" in callback.results[step]
    assert [e.sizes for e in callback.evaluators] == [(30, 16), (30, 16), (30, 16), (30, 16)]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mlm_adapt downstream: ")]
    assert lines[0].startswith(
        "mlm_adapt downstream: linear_probe of sentiment (sequence_classification): 30 "
    )
    assert "pairs (pair_classification)" in lines[0] and "scores (regression)" in lines[0]
    assert "mlm_adapt downstream: sentiment linear_probe train features: 30 rows in " in lines[1]
    assert lines[1].endswith(" s")
    # Per evaluation: the start line, then train/test features and the fit for each of the 4 tasks.
    assert len(lines) == 4 * (1 + 4 * 3)


def test_finetune_of_every_type_at_step_0_and_after(tiny_model_dir, corpus_file, tmp_path, caplog):
    callback = DownstreamEvaluation(
        tasks=all_type_tasks(tmp_path, n=24),
        method="finetune",
        seeds=1,
        finetune_steps=2,
        finetune_batch_size=4,
        max_test_examples=8,
    )
    _fit(tiny_model_dir, corpus_file, tmp_path, callback, caplog, max_steps=3, val_check_interval=2)
    assert sorted(callback.results) == [0, 3]
    for name, metrics in METRICS.items():
        assert all(f"downstream/{name}/{m}" in callback.results[3] for m in metrics)
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("mlm_adapt downstream: scores finetune seed 0: 2 steps in ") for line in lines)


def test_progress_bar_replaces_the_lines(capsys):
    logged = []
    progress = Progress("downstream", bars=True, sink=logged.append)
    with progress.counted("s linear_probe train features", 3, "rows") as advance:
        advance(3)
    assert logged == [] and "s linear_probe train features" in capsys.readouterr().err
    with Progress("downstream", bars=False, sink=logged.append).counted("s fit", 7, "vectors"):
        pass
    assert logged[0].startswith("mlm_adapt downstream: s fit: 7 vectors in ")


@pytest.mark.parametrize("key", ["every_n_validations", "max_train_examples", "max_test_examples"])
def test_bounds_below_one_are_one_line(key):
    with pytest.raises(MLMAdaptError, match=rf"^downstream.{key}=0 must be at least 1$"):
        DownstreamEvaluation(**{key: 0})


@pytest.mark.parametrize(
    ("case", "row", "expected"),
    [
        ("regression_label_not_a_number", {"text": "好", "label": "high"}, "label_column: label 'high' in "),
        (
            "pair_column_missing",
            {"sentence1": "好", "label": "1"},
            "text_pair_column: column 'sentence2' not found",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) and " " not in value else "",
)
def test_cli_reports_bad_pair_and_regression_files_in_one_line(
    tiny_model_dir, corpus_file, tmp_path, capsys, case, row, expected
):
    import json

    from conftest import tiny_fit_args
    from task_files import write_jsonl

    from mlm_adapt.cli.commands import main

    bad = write_jsonl(tmp_path / "bad.jsonl", [row, {**row, "label": "2"}])
    kind = "regression" if case.startswith("regression") else "pair_classification"
    tasks = [{"name": "t", "type": kind, "train_files": [str(bad)], "test_files": [str(bad)]}]
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "fit",
                *tiny_fit_args(
                    tiny_model_dir, corpus_file, tmp_path, f"--downstream.tasks={json.dumps(tasks)}"
                ),
            ]
        )
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mlm_adapt: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"mlm_adapt: error: downstream.tasks[0].{expected}")
