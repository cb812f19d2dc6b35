"""The linear probe and its features: separable tasks, token-label alignment, pairs, entity F1."""

from __future__ import annotations

import torch
from task_files import ner_files, sentiment_files, task, write_jsonl
from transformers import AutoModelForMaskedLM

from mlm_adapt.downstream import TASK_TYPES, TaskEvaluator, load_task
from mlm_adapt.downstream.features import IGNORE, LinearProbe
from mlm_adapt.downstream.types.token import encode_words, entity_spans


def test_probe_reaches_high_accuracy_on_a_separable_task_through_a_saved_model(
    tiny_model_dir, tokenizer, tmp_path
):
    model = AutoModelForMaskedLM.from_pretrained(tiny_model_dir).train()
    evaluator = TaskEvaluator(
        load_task(task("sentiment", sentiment_files(tmp_path)), 0), tokenizer, max_length=64
    )
    scores, spread = evaluator.linear_probe(model, bootstrap=50)
    assert scores["accuracy"] >= 0.95
    assert scores["macro_f1"] >= 0.95
    assert 0 <= spread["accuracy"] < 0.05 and set(spread) == {"accuracy", "macro_f1"}
    assert model.training  # the model's mode is restored


def test_probe_converges_to_a_separating_plane_and_is_deterministic():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(200, 5, generator=generator)
    y = (x[:, 0] - 0.5 * x[:, 3] > 0).long()
    a = LinearProbe(l2=1e-4).fit(x, y, 2)
    b = LinearProbe(l2=1e-4).fit(x, y, 2)
    assert (a.predict(x) == y).float().mean() == 1.0
    assert torch.equal(a.weight, b.weight)
    assert a.iterations < a.max_iter  # stopped on the tolerance, not the iteration cap


def test_word_labels_sit_on_the_first_sub_token_and_long_examples_overflow(tokenizer):
    words = [["北京", "是", "中国", "的", "首都"]]
    labels = [[1, 0, 1, 0, 0]]
    enc = encode_words(tokenizer, words, labels, max_length=64)
    (row,) = enc.rows
    tokens = tokenizer.convert_ids_to_tokens(row["input_ids"])
    assert tokens[:4] == ["[CLS]", "北", "京", "是"]
    assert enc.targets[0][:5] == [IGNORE, 1, IGNORE, 0, 1]
    assert enc.targets[0][-1] == IGNORE  # [SEP]
    assert enc.placed == [[(0, 0), (0, 1), (0, 2), (0, 3), (0, 4)]]
    # 8 tokens + 2 specials do not fit in 6: the example continues in further rows, each word placed once.
    long = encode_words(tokenizer, words, labels, max_length=6)
    assert len(long) >= 2
    placed = [w for row_words in long.placed for w in row_words]
    assert sorted(placed) == [(0, i) for i in range(5)]
    assert all(len(r["input_ids"]) <= 6 for r in long.rows)


def test_pair_task_encodes_both_texts_with_segments_and_scores(tiny_model_dir, tokenizer, tmp_path):
    rows = [
        {"premise": "我很喜欢", "hypothesis": "我喜欢" if i % 2 else "我讨厌", "y": i % 2} for i in range(40)
    ]
    files = (write_jsonl(tmp_path / "nli_train.jsonl", rows), write_jsonl(tmp_path / "nli_test.jsonl", rows))
    spec = task("nli", files, text_column="premise", text_pair_column="hypothesis", label_column="y")
    loaded = load_task(spec, 0)
    assert loaded.train.pairs[:2] == ["我讨厌", "我喜欢"] and loaded.label_names == ["0", "1"]
    enc = TASK_TYPES["sequence_classification"].encode(tokenizer, loaded.train, 64)
    row = enc.rows[0]
    assert tokenizer.decode(row["input_ids"]).replace(" ", "") == "[CLS]我很喜欢[SEP]我讨厌[SEP]"
    assert row["token_type_ids"] == [0] * 6 + [1] * 4
    model = AutoModelForMaskedLM.from_pretrained(tiny_model_dir)
    scores, _ = TaskEvaluator(loaded, tokenizer, 64).linear_probe(model, bootstrap=0)
    assert scores["accuracy"] == 1.0  # the pair's second text alone decides the label


def test_ner_probe_scores_entities(tiny_model_dir, tokenizer, tmp_path):
    loaded = load_task(task("ner", ner_files(tmp_path), type="token_classification"), 0)
    assert loaded.label_names[0] == "O"
    model = AutoModelForMaskedLM.from_pretrained(tiny_model_dir)
    scores, spread = TaskEvaluator(loaded, tokenizer, 64).linear_probe(model, bootstrap=20)
    assert set(scores) == {"f1", "accuracy"} and set(spread) == {"f1", "accuracy"}
    assert scores["f1"] > 0.9


def test_entity_spans_follow_bio_rules():
    assert entity_spans(["B-PER", "I-PER", "O", "B-LOC"]) == {("PER", 0, 2), ("LOC", 3, 4)}
    # An I- that does not continue the same type starts a new entity (conlleval).
    assert entity_spans(["O", "I-LOC", "I-LOC", "I-PER", "B-PER", "B-PER"]) == {
        ("LOC", 1, 3),
        ("PER", 3, 4),
        ("PER", 4, 5),
        ("PER", 5, 6),
    }


def test_finetune_of_a_copy_learns_the_task_and_leaves_the_model_alone(tiny_model_dir, tokenizer, tmp_path):
    model = AutoModelForMaskedLM.from_pretrained(tiny_model_dir)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    evaluator = TaskEvaluator(load_task(task("sentiment", sentiment_files(tmp_path)), 0), tokenizer, 64)
    mean, std = evaluator.finetune(model, seeds=2, steps=60, lr=2e-3, batch_size=16)
    assert mean["accuracy"] >= 0.9 and set(std) == {"accuracy", "macro_f1"}
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    ner = TaskEvaluator(
        load_task(task("ner", ner_files(tmp_path), type="token_classification"), 0), tokenizer, 64
    )
    mean, _ = ner.finetune(model, seeds=1, steps=60, lr=2e-3, batch_size=16)
    assert mean["f1"] >= 0.9
