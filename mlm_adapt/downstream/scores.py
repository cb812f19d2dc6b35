"""Task scores: accuracy and macro-F1 (torchmetrics) for classes, entity-level F1 for BIO tags, and their
bootstrap spread over test examples."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torchmetrics.functional.classification import multiclass_accuracy, multiclass_f1_score

Score = dict[str, float]


def class_scores(preds: torch.Tensor, labels: torch.Tensor, num_classes: int) -> Score:
    """Accuracy (micro) and macro-F1 (unweighted mean of the per-class F1) of class predictions."""
    return {
        "accuracy": multiclass_accuracy(preds, labels, num_classes, average="micro").item(),
        "macro_f1": multiclass_f1_score(preds, labels, num_classes, average="macro").item(),
    }


def entity_spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """``(type, start, end)`` entities of a BIO/IOB2 sequence (``end`` exclusive).

    As in conlleval/seqeval's default mode, an ``I-X`` that does not continue an ``X`` entity starts one.
    """
    spans, kind, start = set(), None, 0
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, label = tag.partition("-")
        continues = prefix == "I" and label == kind
        if kind is not None and not continues:
            spans.add((kind, start, i))
            kind = None
        if prefix in ("B", "I") and not continues:
            kind, start = label, i
    return spans


def sentence_counts(pred_tags: Sequence[Sequence[str]], gold_tags: Sequence[Sequence[str]]) -> torch.Tensor:
    """Per sentence: ``[correct entities, predicted entities, gold entities, correct words, words]``."""
    rows = []
    for pred, gold in zip(pred_tags, gold_tags, strict=True):
        p, g = entity_spans(pred), entity_spans(gold)
        right = sum(a == b for a, b in zip(pred, gold, strict=True))
        rows.append((len(p & g), len(p), len(g), right, len(gold)))
    return torch.tensor(rows, dtype=torch.float64).reshape(-1, 5)


def scores_from_counts(counts: torch.Tensor) -> Score:
    """Micro entity-level F1 (0 when there is nothing to match) and word accuracy of summed counts."""
    correct, predicted, gold, right, words = counts.sum(0).tolist()
    return {
        "f1": 2 * correct / (predicted + gold) if predicted + gold else 0.0,
        "accuracy": right / words if words else 0.0,
    }


def token_scores(
    pred: Sequence[Sequence[int]], gold: Sequence[Sequence[int]], label_names: Sequence[str]
) -> tuple[Score, torch.Tensor]:
    """Entity-level F1 and word accuracy of tag predictions, plus the per-sentence counts (for resampling)."""
    pred_tags = [[label_names[i] for i in row] for row in pred]
    gold_tags = [[label_names[i] for i in row] for row in gold]
    counts = sentence_counts(pred_tags, gold_tags)
    return scores_from_counts(counts), counts


def bootstrap_std(n: int, score: Callable[[torch.Tensor], Score], samples: int, seed: int = 0) -> Score:
    """Standard deviation of ``score(indices)`` over ``samples`` resamples (with replacement) of ``n`` test
    examples: the standard error of each metric due to the choice of test set."""
    if samples < 2:
        return {}
    generator = torch.Generator().manual_seed(seed)
    draws = [score(torch.randint(n, (n,), generator=generator)) for _ in range(samples)]
    return {k: float(torch.tensor([d[k] for d in draws]).std()) for k in draws[0]}


def mean_std(runs: Sequence[Score]) -> tuple[Score, Score]:
    """Mean and sample standard deviation of each metric over runs (std 0 for a single run)."""
    mean = {k: float(sum(r[k] for r in runs) / len(runs)) for k in runs[0]}
    std = {k: float(torch.tensor([r[k] for r in runs]).std()) if len(runs) > 1 else 0.0 for k in runs[0]}
    return mean, std
