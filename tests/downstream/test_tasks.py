"""Loading task files: formats and globs like the corpus, and a one-line error for each bad input."""

from __future__ import annotations

import pytest
from task_files import ner_files, sentiment_files, task, write_jsonl

from mlm_adapt.downstream import load_task
from mlm_adapt.errors import MLMAdaptError


def _bad(spec: dict, index: int = 1) -> str:
    with pytest.raises(MLMAdaptError) as info:
        load_task(spec, index)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_loads_csv_parquet_and_globs_with_string_labels(tmp_path):
    import pandas as pd

    frame = pd.DataFrame({"review": ["好", "差", "很好", "太差"], "stars": [5, 1, 5, 1]})
    frame.to_csv(tmp_path / "a.csv", index=False)
    frame.to_parquet(tmp_path / "b.parquet")
    spec = task(
        "stars", (tmp_path / "*.csv", tmp_path / "b.parquet"), text_column="review", label_column="stars"
    )
    loaded = load_task(spec, 0)
    assert loaded.train.texts == ["好", "差", "很好", "太差"] and loaded.label_names == ["1", "5"]
    assert loaded.test.labels == [1, 0, 1, 0]


def test_missing_file_names_the_task_key(tmp_path):
    message = _bad(task("s", (tmp_path / "nope.jsonl", tmp_path / "nope.jsonl")))
    assert message.startswith("downstream.tasks[1].train_files:") and "nope.jsonl" in message


def test_unknown_column_names_the_key_and_lists_columns(tmp_path):
    message = _bad(task("s", sentiment_files(tmp_path), label_column="stars"))
    assert message.startswith("downstream.tasks[1].label_column: column 'stars' not found")
    assert "columns: text, label" in message


def test_unreadable_and_plain_text_files(tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "好", "label": 1}\n{not json\n', encoding="utf-8")
    assert "could not read" in _bad(task("s", (broken, sentiment_files(tmp_path)[1])))
    gbk = tmp_path / "gbk.jsonl"
    gbk.write_bytes('{"text": "很好", "label": 1}\n'.encode("gb18030"))
    assert "line 1 is not UTF-8" in _bad(task("s", (gbk, sentiment_files(tmp_path)[1])))
    plain = tmp_path / "plain.txt"
    plain.write_text("好\n", encoding="utf-8")
    assert "plain text" in _bad(task("s", (plain, sentiment_files(tmp_path)[1])))


def test_one_class_labels(tmp_path):
    one = write_jsonl(tmp_path / "one.jsonl", [{"text": "好", "label": "pos"}] * 5)
    message = _bad(task("s", (one, sentiment_files(tmp_path)[1])))
    assert message.startswith("downstream.tasks[1].label_column:") and "one label only" in message


def test_test_label_unseen_in_training(tmp_path):
    odd = write_jsonl(tmp_path / "odd.jsonl", [{"text": "一般", "label": "neutral"}])
    assert "'neutral' never occurs in the training files" in _bad(
        task("s", (sentiment_files(tmp_path)[0], odd))
    )


def test_tokens_and_tags_of_different_lengths(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"tokens": ["北", "京"], "tags": ["B-LOC", "I-LOC", "O"]}])
    message = _bad(task("ner", (ner_files(tmp_path)[0], bad), type="token_classification"))
    assert message.startswith("downstream.tasks[1].tags_column: example 0 of")
    assert "2 tokens but 3 tags" in message


def test_tokens_not_a_list(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"tokens": "北京", "tags": ["B-LOC", "I-LOC"]}])
    assert "must be lists" in _bad(task("ner", (ner_files(tmp_path)[0], bad), type="token_classification"))


def test_bad_task_entries(tmp_path):
    assert _bad({"name": "s", "train_files": ["x"]}).startswith("downstream.tasks[1].test_files is required")
    assert "unknown key" in _bad({**task("s", sentiment_files(tmp_path)), "labels": "y"})
    message = _bad(task("s", sentiment_files(tmp_path), type="ranking"))
    assert message.startswith("downstream.tasks[1].type: 'ranking'; use sequence_classification, ")
    assert "cannot name metrics" in _bad(task("a/b", sentiment_files(tmp_path)))
