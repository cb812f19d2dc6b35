"""DownstreamEvaluation inside a real fit: step 0, every validation, logging, fine-tune schedule."""

from __future__ import annotations

import csv

import pytest
import torch
from conftest import make_datamodule, quiet_trainer
from task_files import ner_files, sentiment_files, task, write_jsonl

from mlm_adapt import MaskedLMModule
from mlm_adapt.downstream import DownstreamEvaluation
from mlm_adapt.errors import MLMAdaptError


def _fit(tiny_model_dir, corpus_file, tmp_path, callback, **trainer_args):
    from lightning.pytorch.loggers import CSVLogger

    module = MaskedLMModule(str(tiny_model_dir), max_seq_length=64)
    datamodule = make_datamodule(tiny_model_dir, corpus_file, tmp_path, validation_split=0.1)
    logger = CSVLogger(tmp_path / "logs", name="csv")
    args = dict(max_steps=4, val_check_interval=2, limit_val_batches=1, callbacks=[callback], logger=logger)
    trainer = quiet_trainer(**{**args, **trainer_args})
    trainer.fit(module, datamodule=datamodule)
    with open(logger.log_dir + "/metrics.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return trainer, module, rows


def _logged(rows, name):
    return {int(r["step"]): float(r[name]) for r in rows if r.get(name)}


def test_probe_scores_logged_at_step_0_and_every_validation(tiny_model_dir, corpus_file, tmp_path):
    tasks = [
        task("sentiment", sentiment_files(tmp_path)),
        task("ner", ner_files(tmp_path), type="token_classification"),
    ]
    callback = DownstreamEvaluation(tasks=tasks)
    before = torch.random.get_rng_state()
    trainer, module, rows = _fit(tiny_model_dir, corpus_file, tmp_path, callback)
    accuracy = _logged(rows, "downstream/sentiment/accuracy")
    assert sorted(accuracy) == [0, 1, 3]  # step 0, then the validations after steps 2 and 4
    assert set(_logged(rows, "downstream/ner/f1")) == {0, 1, 3}
    for name in ("sentiment/macro_f1", "sentiment/macro_f1_std", "ner/accuracy_std", "time_s"):
        assert f"downstream/{name}" in trainer.callback_metrics
    assert all(0 <= v <= 1 for v in accuracy.values())
    assert sorted(callback.results) == [0, 2, 4]
    assert callback.results[0]["downstream/time_s"] > 0
    assert not torch.equal(before, torch.random.get_rng_state())  # sanity: training did draw numbers


@pytest.mark.parametrize("method", ["linear_probe", "finetune"])
def test_validate_scores_the_tasks_under_inference_mode(tiny_model_dir, corpus_file, tmp_path, method):
    """``validate`` runs under ``torch.inference_mode`` (Trainer's default), where the probe's and the
    fine-tune's training cannot build a graph unless evaluation leaves it."""
    tasks = [task("sentiment", sentiment_files(tmp_path))]
    options = {"finetune_steps": 2} if method == "finetune" else {}
    callback = DownstreamEvaluation(tasks=tasks, method=method, seeds=1, **options)
    module = MaskedLMModule(str(tiny_model_dir), max_seq_length=64)
    datamodule = make_datamodule(tiny_model_dir, corpus_file, tmp_path, validation_split=0.1)
    trainer = quiet_trainer(limit_val_batches=1, callbacks=[callback])
    (metrics,) = trainer.validate(module, datamodule=datamodule)
    assert 0 <= metrics["downstream/sentiment/accuracy"] <= 1


def test_evaluation_does_not_change_training(tiny_model_dir, corpus_file, tmp_path):
    """The same seed gives the same weights with or without downstream evaluation (probe and fine-tune)."""
    import lightning as L

    weights = []
    for callback in (
        None,
        DownstreamEvaluation(tasks=[task("s", sentiment_files(tmp_path))]),
        DownstreamEvaluation(
            tasks=[task("s", sentiment_files(tmp_path))], method="finetune", seeds=1, finetune_steps=2
        ),
    ):
        L.seed_everything(0)
        module = MaskedLMModule(str(tiny_model_dir), max_seq_length=64)
        datamodule = make_datamodule(tiny_model_dir, corpus_file, tmp_path, validation_split=0.1)
        trainer = quiet_trainer(
            max_steps=3, val_check_interval=2, limit_val_batches=1, callbacks=[callback] if callback else []
        )
        trainer.fit(module, datamodule=datamodule)
        weights.append(torch.cat([p.detach().flatten() for p in module.parameters()]))
    assert torch.equal(weights[0], weights[1]) and torch.equal(weights[0], weights[2])


def test_finetune_runs_at_step_0_and_after_training_only(tiny_model_dir, corpus_file, tmp_path):
    callback = DownstreamEvaluation(
        tasks=[task("sentiment", sentiment_files(tmp_path))], method="finetune", seeds=2, finetune_steps=2
    )
    trainer, module, rows = _fit(tiny_model_dir, corpus_file, tmp_path, callback, max_steps=5)
    assert sorted(callback.results) == [0, 5]  # not at the validations after steps 2 and 4
    assert sorted(_logged(rows, "downstream/sentiment/accuracy")) == [0, 5]
    assert trainer.callback_metrics["downstream/sentiment/accuracy"] == pytest.approx(
        callback.results[5]["downstream/sentiment/accuracy"]
    )
    assert "downstream/sentiment/macro_f1_std" in trainer.callback_metrics


def test_bad_task_fails_before_training(tiny_model_dir, corpus_file, tmp_path):
    # A missing file fails when the callback is made (before the corpus is prepared)...
    with pytest.raises(MLMAdaptError, match=r"downstream.tasks\[0\].train_files"):
        DownstreamEvaluation(tasks=[{"name": "s", "train_files": ["missing.jsonl"], "test_files": ["x"]}])
    with pytest.raises(MLMAdaptError, match="downstream.method"):
        DownstreamEvaluation(method="probe")
    # ... bad content when fit sets up, before the first step.
    one_class = write_jsonl(tmp_path / "one.jsonl", [{"text": "好", "label": "pos"}] * 3)
    callback = DownstreamEvaluation(tasks=[task("s", (one_class, one_class))])
    with pytest.raises(MLMAdaptError, match=r"downstream.tasks\[0\].label_column: .* one label only"):
        _fit(tiny_model_dir, corpus_file, tmp_path, callback)


def test_tokenizer_without_a_data_module_includes_new_tokens(tiny_model_dir, tmp_path):
    """The fallback tokenizer matches a model resized for ``model.new_tokens_file`` (not the base one)."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from mlm_adapt.downstream import DownstreamEvaluation

    tokens = tmp_path / "new_tokens.txt"
    tokens.write_text("好评如潮\n", encoding="utf-8")
    module = SimpleNamespace(
        hparams={"model_name_or_path": str(tiny_model_dir), "new_tokens_file": str(tokens)}
    )
    tokenizer = DownstreamEvaluation()._tokenizer(SimpleNamespace(datamodule=None), module)
    assert len(tokenizer) == len(AutoTokenizer.from_pretrained(tiny_model_dir)) + 1
