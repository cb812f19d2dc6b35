"""Scoring one model on one task by either method; no Lightning here, so scripts can call it directly."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Literal

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mlm_adapt.downstream.features import (
    Encoding,
    Pooling,
    encode_sequences,
    encode_words,
    extract_features,
)
from mlm_adapt.downstream.finetune import finetune, predict
from mlm_adapt.downstream.probe import LinearProbe
from mlm_adapt.downstream.scores import (
    Score,
    bootstrap_std,
    class_scores,
    mean_std,
    scores_from_counts,
    token_scores,
)
from mlm_adapt.downstream.tasks import LoadedTask, TaskSplit

Method = Literal["linear_probe", "finetune"]


def subsample(split: TaskSplit, limit: int | None, seed: int = 0) -> TaskSplit:
    """At most ``limit`` examples, a seeded random subset in file order (``None``: all)."""
    if limit is None or len(split) <= limit:
        return split
    keep = sorted(random.Random(seed).sample(range(len(split)), limit))
    return TaskSplit(
        texts=[split.texts[i] for i in keep] if split.texts else [],
        pairs=[split.pairs[i] for i in keep] if split.pairs is not None else None,
        words=[split.words[i] for i in keep] if split.words else [],
        labels=[split.labels[i] for i in keep],
    )


def _encode(split: TaskSplit, tokenizer: PreTrainedTokenizerBase, max_length: int) -> Encoding:
    if split.words:
        return encode_words(tokenizer, split.words, split.labels, max_length)
    return encode_sequences(tokenizer, split.texts, split.pairs, split.labels, max_length)


class TaskEvaluator:
    """A task tokenized once, scored for any weights of the same tokenizer.

    Args:
        loaded: The task (:func:`~mlm_adapt.downstream.tasks.load_task`).
        tokenizer: The tokenizer of the models to score.
        max_length: Longest row in tokens (token tasks continue longer examples in further rows).
        max_train_examples: Use at most this many training examples (a seeded random subset).
        max_test_examples: Score at most this many test examples (a seeded random subset).
    """

    def __init__(
        self,
        loaded: LoadedTask,
        tokenizer: PreTrainedTokenizerBase,
        max_length: int,
        max_train_examples: int | None = None,
        max_test_examples: int | None = None,
    ):
        self.name = loaded.task.name
        self.label_names = loaded.label_names
        self.token_level = loaded.task.type == "token_classification"
        self.tokenizer = tokenizer
        self.test_labels = subsample(loaded.test, max_test_examples).labels
        self.train = _encode(subsample(loaded.train, max_train_examples), tokenizer, max_length)
        self.test = _encode(subsample(loaded.test, max_test_examples), tokenizer, max_length)

    def _score(
        self, preds: torch.Tensor, words: Sequence[tuple[int, int]], bootstrap: int
    ) -> tuple[Score, Score]:
        """Scores of predictions (per example, or per placed word) and their bootstrap std."""
        if not self.token_level:
            labels = torch.tensor(self.test_labels)
            n = len(self.label_names)
            scores = class_scores(preds, labels, n)
            return scores, bootstrap_std(
                len(labels), lambda i: class_scores(preds[i], labels[i], n), bootstrap
            )
        # Words without a position (they tokenize to nothing) are predicted as the first label, "O" if any.
        pred = [[0] * len(tags) for tags in self.test_labels]
        for (example, word), label in zip(words, preds.tolist(), strict=True):
            pred[example][word] = label
        scores, counts = token_scores(pred, self.test_labels, self.label_names)
        return scores, bootstrap_std(len(pred), lambda i: scores_from_counts(counts[i]), bootstrap)

    def linear_probe(
        self,
        model: PreTrainedModel,
        layers: Sequence[int] = (-1,),
        pooling: Pooling = "mean",
        l2: float = 1e-3,
        batch_size: int = 64,
        bootstrap: int = 200,
        forward_context: Callable[[], AbstractContextManager] | None = None,
    ) -> tuple[Score, Score]:
        """Scores of a logistic-regression probe on frozen features, and their bootstrap std."""
        args = dict(layers=layers, pooling=pooling, batch_size=batch_size, forward_context=forward_context)
        x_train, y_train, _ = extract_features(model, self.tokenizer, self.train, **args)
        x_test, _, words = extract_features(model, self.tokenizer, self.test, **args)
        probe = LinearProbe(l2=l2).fit(x_train, y_train, len(self.label_names))
        return self._score(probe.predict(x_test), words, bootstrap)

    def finetune(
        self,
        model: PreTrainedModel,
        seeds: int = 3,
        steps: int = 200,
        lr: float = 5e-5,
        batch_size: int = 16,
        forward_context: Callable[[], AbstractContextManager] | None = None,
    ) -> tuple[Score, Score]:
        """Mean and std over ``seeds`` short fine-tunes of copies of ``model``."""
        runs = []
        for seed in range(seeds):
            classifier = finetune(
                model,
                self.tokenizer,
                self.train,
                self.label_names,
                self.token_level,
                steps,
                lr,
                batch_size,
                seed,
                forward_context,
            )
            preds, words = predict(classifier, self.tokenizer, self.test, 64, forward_context)
            runs.append(self._score(preds, words, bootstrap=0)[0])
            del classifier
        return mean_std(runs)
