"""Masked-LM metrics beyond torchmetrics' own: word-level accuracy, and the before/after table.

Word accuracy: a masked word counts as right only if all its masked tokens are.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric
from typing_extensions import override


def word_keys(word_ids: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """A batch-unique key per selected token: ``row * L + word_id`` (word ids are compact per row)."""
    batch, length = word_ids.shape
    rows = torch.arange(batch, device=word_ids.device)[:, None] * length
    return (rows + word_ids)[selected]


class WordAccuracy(Metric):
    """Fraction of masked words whose masked tokens are all predicted correctly.

    ``update`` takes one entry per masked token: whether it was predicted right and the key of its word
    (:func:`word_keys`); words are formed within the batch, so a word must not span two batches (blocks
    never split words).
    """

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


# Validation metrics reported before/after adaptation (console, model card, export).
EVAL_METRICS = ("val/loss", "val/accuracy", "val/word_accuracy", "val/perplexity")


def metrics_table(before: dict[str, float], after: dict[str, float]) -> str:
    """A plain-text before/after table of the validation metrics."""
    lines = [f"{'metric':<16}{'before':>12}{'after':>12}"]
    for name in EVAL_METRICS:
        b, a = before.get(name), after.get(name)
        lines.append(
            f"{name:<16}{'n/a' if b is None else f'{b:.4f}':>12}{'n/a' if a is None else f'{a:.4f}':>12}"
        )
    return "\n".join(lines)
