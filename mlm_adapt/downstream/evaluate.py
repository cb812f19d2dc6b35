"""Scoring one model on one task by either method; no Lightning here, so scripts can call it directly."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Literal

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mlm_adapt.data.progress import SILENT, Progress
from mlm_adapt.downstream.features import Pooling, example_order, extract_features
from mlm_adapt.downstream.finetune import finetune, predict
from mlm_adapt.downstream.scores import Score, mean_std
from mlm_adapt.downstream.spec import TaskSplit
from mlm_adapt.downstream.tasks import LoadedTask

Method = Literal["linear_probe", "finetune"]


def subsample(split: TaskSplit, limit: int | None, seed: int = 0) -> TaskSplit:
    """At most ``limit`` examples, a seeded random subset in file order (``None``: all)."""
    if limit is None or len(split) <= limit:
        return split
    return split.subset(sorted(random.Random(seed).sample(range(len(split)), limit)))


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
        self.kind = loaded.kind
        self.label_names = loaded.label_names
        self.tokenizer = tokenizer
        train = subsample(loaded.train, max_train_examples)
        test = subsample(loaded.test, max_test_examples)
        self.sizes = (len(train), len(test))
        self.test_targets = test.labels
        self.train = self.kind.encode(tokenizer, train, max_length)
        self.test = self.kind.encode(tokenizer, test, max_length)

    def describe(self) -> str:
        """``name (type): N train / M test examples``."""
        return f"{self.name} ({self.kind.name}): {self.sizes[0]:,} train / {self.sizes[1]:,} test examples"

    def linear_probe(
        self,
        model: PreTrainedModel,
        layers: Sequence[int] = (-1,),
        pooling: Pooling = "mean",
        l2: float = 1e-3,
        batch_size: int = 64,
        bootstrap: int = 200,
        forward_context: Callable[[], AbstractContextManager] | None = None,
        dtype: torch.dtype = torch.float32,
        progress: Progress = SILENT,
    ) -> tuple[Score, Score]:
        """Scores of the type's probe on frozen features, and their bootstrap std.

        Args:
            model: The masked LM to score (unchanged).
            layers: Hidden states to concatenate (-1: the encoder's output).
            pooling: How a text's token states become one vector (text tasks).
            l2: The probe's L2 weight.
            batch_size: Rows per forward pass.
            bootstrap: Test resamples for the spread.
            forward_context: Context of each forward pass (e.g. autocast).
            dtype: Storage type of the features (the model's precision).
            progress: Where the phases are reported.
        """
        args = dict(
            select=self.kind.select,
            layers=layers,
            pooling=pooling,
            batch_size=batch_size,
            forward_context=forward_context,
            dtype=dtype,
        )
        features = {}
        for split, encoding in (("train", self.train), ("test", self.test)):
            with progress.counted(
                f"{self.name} linear_probe {split} features", len(encoding), "rows"
            ) as advance:
                features[split] = extract_features(model, self.tokenizer, encoding, advance=advance, **args)
        (x_train, y_train, _), (x_test, _, placed) = features["train"], features["test"]
        with progress.counted(f"{self.name} linear_probe fit", len(x_train), "vectors"):
            probe = self.kind.probe(l2).fit(x_train, y_train, len(self.label_names))
            preds = probe.predict(x_test)
        return self.kind.score(preds, placed, self.test_targets, self.label_names, bootstrap)

    def finetune(
        self,
        model: PreTrainedModel,
        seeds: int = 3,
        steps: int = 200,
        lr: float = 5e-5,
        batch_size: int = 16,
        forward_context: Callable[[], AbstractContextManager] | None = None,
        progress: Progress = SILENT,
    ) -> tuple[Score, Score]:
        """Mean and std over ``seeds`` short fine-tunes of copies of ``model``.

        Args:
            model: The masked LM whose weights are copied (unchanged).
            seeds: Fine-tunes, each with its own head init, dropout and batch order.
            steps: Optimizer steps of each.
            lr: AdamW learning rate (linear decay, 10% warmup).
            batch_size: Examples per step.
            forward_context: Context of each forward pass (e.g. autocast).
            progress: Where the phases are reported.
        """
        runs = []
        for seed in range(seeds):
            with progress.counted(f"{self.name} finetune seed {seed}", steps, "steps") as advance:
                classifier = finetune(
                    model,
                    self.tokenizer,
                    self.train,
                    self.kind,
                    self.label_names,
                    steps,
                    lr,
                    batch_size,
                    seed,
                    forward_context,
                    advance,
                )
            what = f"{self.name} finetune seed {seed} test"
            with progress.counted(what, len(self.test), "rows") as advance:
                preds, placed = predict(
                    classifier, self.tokenizer, self.test, self.kind, 64, forward_context, advance
                )
            order = example_order(placed)
            sorted_placed = [placed[i] for i in order]
            score, _ = self.kind.score(preds[order], sorted_placed, self.test_targets, self.label_names, 0)
            runs.append(score)
            del classifier
        return mean_std(runs)
