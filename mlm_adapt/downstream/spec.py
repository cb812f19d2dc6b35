"""What a downstream task is: its ``downstream.tasks`` entry and the examples of one split (plain data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DownstreamTask:
    """One labelled task evaluated during adaptation.

    Args:
        name: Short name; metrics are logged as ``downstream/<name>/<metric>``.
        train_files: Files (or globs) the probe or fine-tune learns from.
        test_files: Files (or globs) the task is scored on.
        type: ``sequence_classification`` (one label per text, or per text pair when ``text_pair_column``
            is set), ``pair_classification`` (one label per text pair, e.g. CLUE AFQMC/OCNLI),
            ``token_classification`` (one BIO tag per word, e.g. NER) or ``regression`` (one number per
            text or text pair, e.g. STS similarity).
        text_column: Text column (default ``text``; ``sentence1`` for ``pair_classification``).
        text_pair_column: Second text column, encoded as ``tokenizer(text, text_pair)`` (default none;
            ``sentence2`` for ``pair_classification``, where it is required).
        label_column: Label column: class names or integers; numbers for ``regression``.
        tokens_column: Column holding each example's words as a list (token classification).
        tags_column: Column holding one tag per word (token classification), e.g. ``B-PER``/``I-PER``/``O``.
    """

    name: str
    train_files: list[str]
    test_files: list[str]
    type: str = "sequence_classification"
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str = "label"
    tokens_column: str = "tokens"
    tags_column: str = "tags"


@dataclass
class TaskSplit:
    """One split of a loaded task. ``texts`` (and ``pairs``) for text tasks, ``words`` for token tasks;
    ``labels`` holds one target per example (a class index, a number, or a list of tag indices)."""

    texts: list[str] = field(default_factory=list)
    pairs: list[str] | None = None
    words: list[list[str]] = field(default_factory=list)
    labels: list[Any] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, keep: list[int]) -> TaskSplit:
        """The examples at positions ``keep``, in that order."""
        return TaskSplit(
            texts=[self.texts[i] for i in keep] if self.texts else [],
            pairs=[self.pairs[i] for i in keep] if self.pairs is not None else None,
            words=[self.words[i] for i in keep] if self.words else [],
            labels=[self.labels[i] for i in keep],
        )


def task_key(index: int, name: str) -> str:
    """The config key of a task's field, as error messages name it."""
    return f"downstream.tasks[{index}].{name}"
