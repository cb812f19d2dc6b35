"""Labelled task files for the downstream tests (in a test's tmp dir): separable sentiment, BIO tags."""

from __future__ import annotations

import json
import random
from pathlib import Path

POSITIVE, NEGATIVE, FILLER = "好棒喜欢满意赞", "差坏糟失望烂贵", "的了是我这个书房间"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def separable_rows(n: int, seed: int) -> list[dict]:
    """Reviews whose label is decided by which of two character sets they draw from (plus shared filler)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = "pos" if i % 2 else "neg"
        chars = POSITIVE if label == "pos" else NEGATIVE
        text = "".join(rng.choice(chars if rng.random() < 0.5 else FILLER) for _ in range(rng.randint(6, 16)))
        rows.append({"text": text, "label": label})
    return rows


def sentiment_files(tmp_path: Path) -> tuple[Path, Path]:
    """Separable train/test jsonl files (``text``, ``label``) in ``tmp_path``."""
    return (
        write_jsonl(tmp_path / "sent_train.jsonl", separable_rows(240, 0)),
        write_jsonl(tmp_path / "sent_test.jsonl", separable_rows(120, 1)),
    )


def ner_rows(n: int, seed: int) -> list[dict]:
    """Character-level BIO sentences: place names from one list, person names from another."""
    rng = random.Random(seed)
    places, people = ["北京", "上海", "天津"], ["张三", "李明"]
    rows = []
    for _ in range(n):
        tokens, tags = [], []
        for _ in range(rng.randint(2, 4)):
            kind = rng.choice(["LOC", "PER", None, None])
            word = (
                rng.choice(places if kind == "LOC" else people)
                if kind
                else rng.choice(["的", "是", "了", "我"])
            )
            for j, ch in enumerate(word):
                tokens.append(ch)
                tags.append("O" if kind is None else ("B-" if j == 0 else "I-") + kind)
        rows.append({"tokens": tokens, "tags": tags})
    return rows


def ner_files(tmp_path: Path) -> tuple[Path, Path]:
    """BIO train/test jsonl files (``tokens``, ``tags``) in ``tmp_path``."""
    return (
        write_jsonl(tmp_path / "ner_train.jsonl", ner_rows(120, 0)),
        write_jsonl(tmp_path / "ner_test.jsonl", ner_rows(60, 1)),
    )


def task(name: str, files: tuple[Path, Path], **extra) -> dict:
    """A ``downstream.tasks`` entry."""
    return {"name": name, "train_files": [str(files[0])], "test_files": [str(files[1])], **extra}


def pair_rows(n: int, seed: int) -> list[dict]:
    """CLUE-style pairs (``sentence1``, ``sentence2``, ``label`` "0"/"1"): the second sentence's characters
    decide the label; the first is shared filler."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        chars = POSITIVE if i % 2 else NEGATIVE
        first = "".join(rng.choice(FILLER) for _ in range(rng.randint(4, 10)))
        second = "".join(
            rng.choice(chars if rng.random() < 0.6 else FILLER) for _ in range(rng.randint(4, 10))
        )
        rows.append({"sentence1": first, "sentence2": second, "label": str(i % 2)})
    return rows


def pair_files(tmp_path: Path, n: int = 120) -> tuple[Path, Path]:
    """CLUE-format train/test jsonl pair files in ``tmp_path``."""
    return (
        write_jsonl(tmp_path / "pair_train.jsonl", pair_rows(n, 0)),
        write_jsonl(tmp_path / "pair_test.jsonl", pair_rows(n // 2, 1)),
    )


def score_rows(n: int, seed: int) -> list[dict]:
    """Texts scored 0-5 by the share of 'positive' characters among filler (``text``, ``score``)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        length, share = rng.randint(8, 16), rng.random()
        text = "".join(rng.choice(POSITIVE if rng.random() < share else FILLER) for _ in range(length))
        positive = sum(ch in POSITIVE for ch in text)
        rows.append({"text": text, "score": round(5 * positive / length, 3)})
    return rows


def score_files(tmp_path: Path, n: int = 160) -> tuple[Path, Path]:
    """Regression train/test jsonl files (``text``, ``score``) in ``tmp_path``."""
    return (
        write_jsonl(tmp_path / "score_train.jsonl", score_rows(n, 0)),
        write_jsonl(tmp_path / "score_test.jsonl", score_rows(n // 2, 1)),
    )


def all_type_tasks(tmp_path: Path, n: int = 120) -> list[dict]:
    """One task of every built-in type (sequence, pair, token, regression), small."""
    return [
        task("sentiment", sentiment_files(tmp_path)),
        task("pairs", pair_files(tmp_path, n), type="pair_classification"),
        task("ner", ner_files(tmp_path), type="token_classification"),
        task("scores", score_files(tmp_path, n), type="regression", label_column="score"),
    ]
