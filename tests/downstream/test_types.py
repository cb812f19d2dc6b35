"""Task types (sequence, pair, token, regression) by both methods; pair encoding; regression metrics against
pandas; each bad input of the new types as one line."""

from __future__ import annotations

import pytest
import torch
from task_files import pair_files, score_files, score_rows, sentiment_files, task, write_jsonl
from transformers import AutoModelForMaskedLM

from mlm_adapt.downstream import TASK_TYPES, TaskEvaluator, load_task
from mlm_adapt.downstream.features import RidgeProbe, extract_features, layer_states
from mlm_adapt.downstream.types.sequence import correlations
from mlm_adapt.errors import MLMAdaptError


def _bad(spec: dict) -> str:
    with pytest.raises(MLMAdaptError) as info:
        load_task(spec, 2)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForMaskedLM.from_pretrained(tiny_model_dir)


def test_clue_pair_jsonl_loads_as_is_and_encodes_as_tokenizer_text_pair(tokenizer, tmp_path):
    loaded = load_task(task("afqmc", pair_files(tmp_path, 20), type="pair_classification"), 0)
    assert loaded.kind.name == "pair_classification" and loaded.label_names == ["0", "1"]
    encoding = TaskEvaluator(loaded, tokenizer, max_length=64).train
    for i, row in enumerate(encoding.rows):
        expected = tokenizer(loaded.train.texts[i], loaded.train.pairs[i])
        assert row["input_ids"] == expected["input_ids"]
        assert row["token_type_ids"] == expected["token_type_ids"]
        assert row["attention_mask"] == expected["attention_mask"]
    assert set(encoding.rows[0]["token_type_ids"]) == {0, 1}  # both segments present


@pytest.mark.parametrize(
    ("kind", "metric", "minimum"),
    [
        ("sequence_classification", "accuracy", 0.95),
        ("pair_classification", "accuracy", 0.9),
        ("regression", "pearson", 0.8),
    ],
)
def test_linear_probe_learns_each_text_type(model, tokenizer, tmp_path, kind, metric, minimum):
    specs = {
        "sequence_classification": task("s", sentiment_files(tmp_path)),
        "pair_classification": task("p", pair_files(tmp_path), type="pair_classification"),
        "regression": task("r", score_files(tmp_path), type="regression", label_column="score"),
    }
    scores, spread = TaskEvaluator(load_task(specs[kind], 0), tokenizer, 64).linear_probe(model, bootstrap=30)
    assert scores[metric] >= minimum, scores
    assert set(spread) == set(scores) and all(0 < v < 0.2 for v in spread.values()), spread


@pytest.mark.parametrize(
    ("kind", "metric", "minimum"), [("pair_classification", "accuracy", 0.9), ("regression", "pearson", 0.6)]
)
def test_finetune_learns_pairs_and_regression_and_leaves_the_model_alone(
    model, tokenizer, tmp_path, kind, metric, minimum
):
    specs = {
        "pair_classification": task("p", pair_files(tmp_path), type="pair_classification"),
        "regression": task("r", score_files(tmp_path), type="regression", label_column="score"),
    }
    state = {k: v.clone() for k, v in model.state_dict().items()}
    evaluator = TaskEvaluator(load_task(specs[kind], 0), tokenizer, 64)
    mean, std = evaluator.finetune(model, seeds=1, steps=60, lr=2e-3, batch_size=16)
    assert mean[metric] >= minimum, mean
    assert set(std) == set(mean)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_regression_metrics_equal_pandas_with_ties_and_bootstrap_spread():
    import pandas as pd  # an independent implementation (Cython, average ranks for ties), no scipy needed

    generator = torch.Generator().manual_seed(0)
    gold = torch.randint(0, 6, (200,), generator=generator).double()  # many ties, as STS scores have
    preds = gold + torch.randn(200, generator=generator, dtype=torch.float64)
    scores = correlations(preds, gold)
    frame = pd.DataFrame({"preds": preds.numpy(), "gold": gold.numpy()})
    assert scores["pearson"] == pytest.approx(frame.corr()["preds"]["gold"], abs=1e-9)
    assert scores["spearman"] == pytest.approx(frame.corr(method="spearman")["preds"]["gold"], abs=1e-6)
    _, spread = TASK_TYPES["regression"].score(preds, [], gold.tolist(), [], bootstrap=50)
    assert set(spread) == {"pearson", "spearman"} and 0 < spread["pearson"] < 0.1
    assert correlations(torch.ones(5), gold[:5]) == {"pearson": 0.0, "spearman": 0.0}  # undefined: 0


def test_ridge_probe_recovers_a_linear_target():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(300, 6, generator=generator)
    y = 3 * x[:, 1] - x[:, 4] + 7
    probe = RidgeProbe(l2=1e-6).fit(x, y)
    assert torch.allclose(probe.predict(x), y.double(), atol=1e-3)


def test_regression_reads_numeric_strings_and_keeps_float_targets(tmp_path):
    rows = [{"text": "好", "score": "4.5"}, {"text": "差", "score": 1}, {"text": "一般", "score": 2.25}]
    files = (write_jsonl(tmp_path / "r.jsonl", rows), write_jsonl(tmp_path / "r.jsonl", rows))
    loaded = load_task(task("r", files, type="regression", label_column="score"), 0)
    assert loaded.train.labels == [4.5, 1.0, 2.25] and loaded.label_names == []


@pytest.mark.parametrize(
    ("value", "shown"), [("high", "'high'"), (None, "None"), (True, "True"), ("nan", "'nan'"), ([1], "[1]")]
)
def test_non_numeric_regression_label_is_one_line(tmp_path, value, shown):
    rows = [*score_rows(4, 0), {"text": "好", "score": value}]
    bad = write_jsonl(tmp_path / "bad.jsonl", rows)
    message = _bad(task("r", (bad, bad), type="regression", label_column="score"))
    assert message.startswith(f"downstream.tasks[2].label_column: label {shown} in {bad} is not a number")


def test_regression_with_one_value_is_one_line(tmp_path):
    same = write_jsonl(tmp_path / "same.jsonl", [{"text": "好", "label": 3}] * 4)
    assert "hold one value only" in _bad(task("r", (same, same), type="regression"))


def test_missing_pair_column_names_the_key(tmp_path):
    files = sentiment_files(tmp_path)  # text/label only
    message = _bad(task("p", files, type="pair_classification", text_column="text"))
    assert message.startswith("downstream.tasks[2].text_pair_column: column 'sentence2' not found in ")
    message = _bad(task("p", files, type="pair_classification", text_column="text", text_pair_column="hyp"))
    assert message.startswith("downstream.tasks[2].text_pair_column: column 'hyp' not found in ")


def test_layer_states_keeps_only_the_output_by_default(model, tokenizer):
    """The default layer asks for the encoder's output only (not every layer's states); the others still
    work and the output equals the last hidden state for BERT."""
    calls = []
    encoder = model.base_model
    hook = encoder.register_forward_hook(lambda m, a, kw, out: calls.append(kw), with_kwargs=True)
    batch = dict(tokenizer(["北京是首都"], return_tensors="pt"))
    try:
        with torch.no_grad():
            last = layer_states(encoder, batch, [-1])
            both = layer_states(encoder, batch, [0, -1])
    finally:
        hook.remove()
    assert "output_hidden_states" not in calls[0] and calls[1]["output_hidden_states"] is True
    assert both.shape[-1] == 2 * last.shape[-1] and torch.allclose(both[..., last.shape[-1] :], last)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_features_are_stored_in_the_given_precision(model, tokenizer, tmp_path, dtype):
    evaluator = TaskEvaluator(load_task(task("s", sentiment_files(tmp_path)), 0), tokenizer, 64, 40, 20)
    full, labels, _ = extract_features(model, tokenizer, evaluator.test, evaluator.kind.select)
    half, same_labels, _ = extract_features(
        model, tokenizer, evaluator.test, evaluator.kind.select, dtype=dtype
    )
    assert full.dtype == torch.float32 and half.dtype == dtype and half.shape == full.shape == (20, 32)
    assert torch.equal(labels, same_labels) and torch.allclose(half.float(), full, rtol=1e-2, atol=1e-2)
    scores, _ = evaluator.linear_probe(model, bootstrap=0, dtype=dtype)
    assert scores["accuracy"] >= 0.9


def test_example_bounds_are_seeded_subsets_in_file_order(tokenizer, tmp_path):
    loaded = load_task(task("s", sentiment_files(tmp_path)), 0)
    a = TaskEvaluator(loaded, tokenizer, 64, max_train_examples=50, max_test_examples=10)
    b = TaskEvaluator(loaded, tokenizer, 64, max_train_examples=50, max_test_examples=10)
    assert a.sizes == (50, 10) and a.describe() == "s (sequence_classification): 50 train / 10 test examples"
    assert [r["input_ids"] for r in a.train.rows] == [r["input_ids"] for r in b.train.rows]
    first = tokenizer(loaded.train.texts)["input_ids"]
    positions = [first.index(r["input_ids"]) for r in a.train.rows]
    assert positions == sorted(positions)
