"""Masked-LM metrics beyond torchmetrics' own: word-level accuracy, and the before/after table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torchmetrics import Metric
from typing_extensions import override


def word_keys(word_ids: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """A batch-unique key per selected token: ``row * L + word_id`` (word ids are compact per row)."""
    batch, length = word_ids.shape
    rows = torch.arange(batch, device=word_ids.device)[:, None] * length
    return (rows + word_ids)[selected]


class WordAccuracy(Metric):
    """Fraction of masked words whose masked tokens are all right; ``update`` takes, per masked token,
    whether it was right and its word's key (:func:`word_keys`). Words are formed within the batch, so a
    word must not span two batches (blocks never split words)."""

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("correct", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    @override
    def update(self, token_correct: torch.Tensor, keys: torch.Tensor) -> None:
        if keys.numel() == 0:
            return
        _, word = torch.unique(keys, return_inverse=True)
        n_words = int(word.max()) + 1
        wrong = torch.zeros(n_words, dtype=torch.int64, device=keys.device)
        wrong.scatter_add_(0, word, (~token_correct.bool()).long())
        self.correct += (wrong == 0).sum()
        self.total += n_words

    @override
    def compute(self) -> torch.Tensor:
        return self.correct.float() / self.total.clamp(min=1)


def validation_prefix(index: int, names: Sequence[str] = ()) -> str:
    """The metric prefix of the validation set at ``index`` (``dataloader_idx``): ``val`` for the first,
    then ``val_<name>`` by ``names`` (``MLMDataModule.validation_set_names``), else ``val_<index>``."""
    if index == 0:
        return "val"
    return f"val_{names[index]}" if index < len(names) else f"val_{index}"


# Validation metrics of each set, in table order.
EVAL_NAMES = ("loss", "accuracy", "word_accuracy", "perplexity")
# Logged metrics that are compared before and after adaptation: every validation set, every downstream task.
BEFORE_AFTER_PREFIXES = ("val/", "val_", "downstream/")


def before_after_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The before/after metrics among logged ``metrics`` (e.g. ``trainer.callback_metrics``), as floats."""
    return {k: float(v) for k, v in metrics.items() if k.startswith(BEFORE_AFTER_PREFIXES)}


def before_after_names(before: Mapping[str, float], after: Mapping[str, float]) -> list[str]:
    """The rows of a before/after table: the first validation set, the other sets, then downstream tasks,
    each in the order logged; a set's rows are loss, accuracy, word accuracy, perplexity."""
    names = list(dict.fromkeys([*before, *after]))
    groups: dict[str, int] = {}
    for name in names:
        groups.setdefault(name.rpartition("/")[0], len(groups))

    def key(name: str) -> tuple[int, int, int]:
        group, _, metric = name.rpartition("/")
        kind = 0 if group == "val" else 2 if name.startswith("downstream/") else 1
        position = EVAL_NAMES.index(metric) if kind < 2 and metric in EVAL_NAMES else len(EVAL_NAMES)
        return kind, groups[group], position

    return sorted(names, key=key)  # stable: equal keys keep the logged order


# A metric's spread is logged next to it as ``<metric>_std`` (seeds or bootstrap); the table shows it in the
# metric's cell. Timing is logged, not compared.
SPREAD_SUFFIX = "_std"
_NOT_COMPARED = ("downstream/time_s",)


def _cell(values: Mapping[str, float], name: str) -> str:
    value, spread = values.get(name), values.get(name + SPREAD_SUFFIX)
    if value is None:
        return "n/a"
    return f"{value:.4f}" if spread is None else f"{value:.4f} ± {spread:.4f}"


def metrics_table(
    before: Mapping[str, float],
    after: Mapping[str, float],
    merged: Mapping[str, float] | None = None,
    merged_head: str = "merged",
) -> str:
    """A plain-text before/after table of every validation set and downstream task (spreads as ``±``), with
    a third column of the ``merged`` weights' metrics (those it lacks: "n/a") when given."""
    names = [
        n
        for n in before_after_names(before, after)
        if not n.endswith(SPREAD_SUFFIX) and n not in _NOT_COMPARED
    ]
    width = max([len("metric"), *map(len, names)]) + 2
    third = merged is not None
    head = f"{'metric':<{width}}{'before':>18}{'after':>18}" + (f"{merged_head:>18}" if third else "")
    lines = [head]
    for n in names:
        cells = _cell(before, n).rjust(18) + _cell(after, n).rjust(18)
        lines.append(f"{n:<{width}}{cells}" + (_cell(merged, n).rjust(18) if third else ""))
    return "\n".join(lines)
