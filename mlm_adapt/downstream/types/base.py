"""What a downstream task is (its ``downstream.tasks`` entry, one split's examples) and ``TaskType``, the
interface every task type implements (one module per type, registered in ``__init__``)."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import datasets
import torch
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from mlm_adapt.downstream.features import Encoding, LinearProbe, Place, Pooling
from mlm_adapt.errors import MLMAdaptError

Score = dict[str, float]


@dataclass
class DownstreamTask:
    """One labelled task evaluated during adaptation.

    Args:
        name: Short name; metrics are logged as ``downstream/<name>/<metric>``.
        train_files: Files (or globs) the probe or fine-tune learns from.
        test_files: Files (or globs) the task is scored on.
        type: ``sequence_classification``, ``pair_classification``, ``token_classification`` or
            ``regression`` (docs/downstream.md).
        text_column: Text column (default ``text``; ``sentence1`` for ``pair_classification``).
        text_pair_column: Second text column (default none; ``sentence2``, required, for pairs).
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

    def sample(self, limit: int | None, seed: int = 0) -> TaskSplit:
        """At most ``limit`` examples, a seeded random subset in file order (``None``: all)."""
        if limit is None or len(self) <= limit:
            return self
        keep = sorted(random.Random(seed).sample(range(len(self)), limit))
        return TaskSplit(
            texts=[self.texts[i] for i in keep] if self.texts else [],
            pairs=[self.pairs[i] for i in keep] if self.pairs is not None else None,
            words=[self.words[i] for i in keep] if self.words else [],
            labels=[self.labels[i] for i in keep],
        )


def task_key(index: int, name: str) -> str:
    """The config key of a task's field, as error messages name it."""
    return f"downstream.tasks[{index}].{name}"


def bootstrap_std(n: int, score: Callable[[torch.Tensor], Score], samples: int, seed: int = 0) -> Score:
    """Standard deviation of ``score(indices)`` over ``samples`` resamples (with replacement) of ``n`` test
    examples: the standard error of each metric due to the choice of test set."""
    if samples < 2:
        return {}
    generator = torch.Generator().manual_seed(seed)
    draws = [score(torch.randint(n, (n,), generator=generator)) for _ in range(samples)]
    return {k: float(torch.tensor([d[k] for d in draws]).std()) for k in draws[0]}


class Probe(Protocol):
    """A model fitted on frozen features."""

    def fit(self, x: torch.Tensor, y: torch.Tensor, num_labels: int) -> Probe: ...

    def predict(self, x: torch.Tensor) -> torch.Tensor: ...


class TaskType(ABC):
    """One kind of labelled task; stateless, so one instance serves every task of the type.

    Attributes:
        name: The ``type:`` value of a task entry.
        default_columns: Config key → column name when the entry leaves the key unset (``None``: none).
        required: Config keys that must name a column.
        label_key: The config key of the labels (named by label errors).
        auto_model: The ``AutoModelFor…`` class a fine-tune builds.
    """

    name: ClassVar[str]
    default_columns: ClassVar[dict[str, str | None]]
    required: ClassVar[tuple[str, ...]] = ()
    label_key: ClassVar[str] = "label_column"
    auto_model: ClassVar[Any]

    def columns(self, task: DownstreamTask) -> dict[str, str]:
        """Config key → column to load, for the keys this type reads that name a column."""
        chosen = {key: getattr(task, key) or default for key, default in self.default_columns.items()}
        return {key: column for key, column in chosen.items() if column}

    def check(self, task: DownstreamTask, index: int) -> None:
        """Raises a one-line error for a config entry this type cannot use."""
        columns = self.columns(task)
        for key in self.required:
            if key not in columns:
                raise MLMAdaptError(
                    f"{task_key(index, key)} is required for type {self.name}; name the column that holds it"
                )

    @abstractmethod
    def read(
        self, table: datasets.Dataset, task: DownstreamTask, index: int, files: str
    ) -> tuple[TaskSplit, list]:
        """The examples of a loaded table (columns as :meth:`columns`) and their raw labels, checked;
        ``index`` (the task's position) and ``files`` (comma-separated) are for error messages."""

    @abstractmethod
    def targets(
        self, train: list, test: list, index: int, task: DownstreamTask
    ) -> tuple[list[str], list, list]:
        """Label names (empty for numeric targets) and the targets of both splits."""

    @abstractmethod
    def encode(self, tokenizer: PreTrainedTokenizerBase, split: TaskSplit, max_length: int) -> Encoding:
        """Tokenized rows of ``split``, at most ``max_length`` tokens each."""

    @abstractmethod
    def select(
        self,
        states: torch.Tensor,
        batch: dict[str, torch.Tensor],
        rows: list[int],
        encoding: Encoding,
        pooling: Pooling,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The probe's features ``[k, dim]`` and targets ``[k]`` of the units placed in ``rows`` (in row
        order), from a batch's hidden states."""

    @abstractmethod
    def probe(self, l2: float) -> Probe:
        """A fresh probe with L2 weight ``l2``."""

    @abstractmethod
    def configure(self, config: PretrainedConfig, label_names: list[str]) -> None:
        """Sets the fine-tuning head's size (``num_labels``, ``problem_type``…) on ``config``."""

    @abstractmethod
    def batch_labels(self, encoding: Encoding, rows: list[int], width: int) -> torch.Tensor:
        """Labels of a fine-tuning batch of ``rows`` padded to ``width`` tokens."""

    @abstractmethod
    def predictions(self, logits: torch.Tensor, encoding: Encoding, rows: list[int]) -> torch.Tensor:
        """Predictions of the units placed in ``rows`` (in row order) from a fine-tune's logits."""

    @abstractmethod
    def score(
        self, preds: torch.Tensor, placed: list[Place], gold: list, label_names: list[str], bootstrap: int
    ) -> tuple[Score, Score]:
        """Metrics of ``preds`` (sorted by ``placed``) against the test targets ``gold``, and their bootstrap
        standard error over test examples (``bootstrap`` resamples; none below 2)."""


class ClassificationType(TaskType, ABC):
    """A type whose targets are class indices: a logistic-regression probe and labels named in the config."""

    def probe(self, l2: float) -> Probe:
        return LinearProbe(l2=l2)

    def configure(self, config: PretrainedConfig, label_names: list[str]) -> None:
        config.num_labels = len(label_names)
        config.id2label = dict(enumerate(label_names))
        config.label2id = {name: i for i, name in enumerate(label_names)}


def class_label(value: Any, key: str, files: str) -> str:
    """A class name from a label cell (strings and numbers; ``1`` and ``"1"`` are the same class)."""
    if value is None or isinstance(value, (list, dict)):
        raise MLMAdaptError(f"{key}: label {value!r} in {files} is not a class name or number")
    return str(value)


def class_names(
    train: list[str], test: list[str], key: str, files: str, first: str | None = None
) -> list[str]:
    """Sorted class names of the training labels (``first`` leads when present), checked against the test
    labels: at least two classes, and no test class the training files lack."""
    names = sorted(set(train))
    if len(names) < 2:
        raise MLMAdaptError(
            f"{key}: the training files {files} have one label only ({names[0]!r}); "
            "a task needs at least two classes"
        )
    unseen = sorted(set(test) - set(names))
    if unseen:
        raise MLMAdaptError(
            f"{key}: test label {unseen[0]!r} never occurs in the training files; "
            "add training examples for it or drop it from the test files"
        )
    if first in names:
        names.remove(first)
        names.insert(0, first)
    return names
