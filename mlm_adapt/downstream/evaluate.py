"""Scoring one model on one task by either method; no Lightning here, so scripts can call it directly.

A fine-tune trains a COPY of the current weights in a fresh model of the task type's ``auto_model`` class.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Literal

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, get_linear_schedule_with_warmup

from mlm_adapt.data.progress import SILENT, Progress
from mlm_adapt.downstream.features import (
    MODEL_INPUTS,
    ForwardContext,
    Place,
    Pooling,
    batches,
    encoder_of,
    example_order,
    extract_features,
    pad,
)
from mlm_adapt.downstream.tasks import LoadedTask
from mlm_adapt.downstream.types import TaskType
from mlm_adapt.downstream.types.base import Score
from mlm_adapt.errors import MLMAdaptError

Method = Literal["linear_probe", "finetune"]


def mean_std(runs: Sequence[Score]) -> tuple[Score, Score]:
    """Mean and sample standard deviation of each metric over runs (std 0 for a single run)."""
    mean = {k: float(sum(r[k] for r in runs) / len(runs)) for k in runs[0]}
    std = {k: float(torch.tensor([r[k] for r in runs]).std()) if len(runs) > 1 else 0.0 for k in runs[0]}
    return mean, std


def classifier_copy(model: PreTrainedModel, kind: TaskType, label_names: list[str]) -> PreTrainedModel:
    """A model of the task type's head class with ``model``'s encoder weights (copied) and a new head."""
    config = copy.deepcopy(model.config)
    kind.configure(config, label_names)
    auto = kind.auto_model
    try:
        classifier = auto.from_config(config)
    except ValueError as exc:
        raise MLMAdaptError(
            f"downstream.method=finetune: {config.model_type!r} has no {auto.__name__[12:]} class; "
            "use method: linear_probe"
        ) from exc
    source = encoder_of(model).state_dict()
    missing, unexpected = encoder_of(classifier).load_state_dict(source, strict=False)
    # Only layers a masked LM does not have (BERT's pooler) may stay randomly initialized.
    if unexpected or any(not k.startswith("pooler.") for k in missing):
        raise MLMAdaptError(
            "downstream.method=finetune: the encoder weights do not fit the classification model "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]}); use method: linear_probe"
        )
    param = next(model.parameters())
    return classifier.to(device=param.device, dtype=param.dtype)


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
        train, test = loaded.train.sample(max_train_examples), loaded.test.sample(max_test_examples)
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
        forward_context: ForwardContext = nullcontext,
        dtype: torch.dtype = torch.float32,
        progress: Progress = SILENT,
    ) -> tuple[Score, Score]:
        """Scores of the type's probe on frozen features, and their bootstrap std.

        The options are :class:`~mlm_adapt.downstream.DownstreamEvaluation`'s (``l2``: ``probe_l2``);
        ``dtype`` stores the features (the model's precision), ``progress`` reports the phases.
        """
        args = dict(layers=layers, pooling=pooling, batch_size=batch_size, forward_context=forward_context)
        features = {}
        for split, encoding in (("train", self.train), ("test", self.test)):
            what = f"{self.name} linear_probe {split} features"
            with progress.counted(what, len(encoding), "rows") as advance:
                features[split] = extract_features(
                    model, self.tokenizer, encoding, self.kind.select, dtype=dtype, advance=advance, **args
                )
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
        forward_context: ForwardContext = nullcontext,
        progress: Progress = SILENT,
    ) -> tuple[Score, Score]:
        """Mean and std over ``seeds`` short fine-tunes of copies of ``model`` (left unchanged), each with
        its own head init, dropout and batch order; the options are ``DownstreamEvaluation``'s ``finetune_*``.
        """
        runs = []
        for seed in range(seeds):
            with progress.counted(f"{self.name} finetune seed {seed}", steps, "steps") as advance:
                classifier = self._finetune(model, steps, lr, batch_size, seed, forward_context, advance)
            with progress.counted(
                f"{self.name} finetune seed {seed} test", len(self.test), "rows"
            ) as advance:
                preds, placed = self._predict(classifier, forward_context, advance)
            runs.append(self.kind.score(preds, placed, self.test_targets, self.label_names, 0)[0])
            del classifier
        return mean_std(runs)

    def _finetune(
        self,
        model: PreTrainedModel,
        steps: int,
        lr: float,
        batch_size: int,
        seed: int,
        forward_context: ForwardContext,
        advance: Callable[[int], None],
    ) -> PreTrainedModel:
        """A copy of ``model`` fine-tuned for ``steps`` AdamW steps (linear decay, 10% warmup).

        The copy's head init, dropout and batch order all follow ``seed`` (batches are drawn from a seeded
        permutation of the training rows, reshuffled at each pass). ``advance(1)`` follows each step.
        """
        torch.manual_seed(seed)
        classifier = classifier_copy(model, self.kind, self.label_names).train()
        device = next(classifier.parameters()).device
        optimizer = torch.optim.AdamW(classifier.parameters(), lr=lr, weight_decay=0.01)
        schedule = get_linear_schedule_with_warmup(optimizer, max(steps // 10, 1), steps)
        generator = torch.Generator().manual_seed(seed)
        order: list[int] = []
        with torch.enable_grad():
            for _ in range(steps):
                if len(order) < batch_size:
                    order += torch.randperm(len(self.train), generator=generator).tolist()
                index, order = order[:batch_size], order[batch_size:]
                batch = pad(self.train, index, self.tokenizer, device, keys=MODEL_INPUTS)
                width = batch["input_ids"].shape[1]
                batch["labels"] = self.kind.batch_labels(self.train, index, width).to(device)
                with forward_context():
                    loss = classifier(**batch).loss
                loss.backward()
                optimizer.step()
                schedule.step()
                optimizer.zero_grad(set_to_none=True)
                advance(1)
        return classifier.eval()

    @torch.no_grad()
    def _predict(
        self, classifier: PreTrainedModel, forward_context: ForwardContext, advance: Callable[[int], None]
    ) -> tuple[torch.Tensor, list[Place]]:
        """The type's prediction for every unit of the test rows and its ``(example, unit)``, sorted by it."""
        device = next(classifier.parameters()).device
        preds, placed = [], []
        for index, batch in batches(self.test, self.tokenizer, 64, device):
            with forward_context():
                logits = classifier(**{k: v for k, v in batch.items() if k in MODEL_INPUTS}).logits
            preds.append(self.kind.predictions(logits, self.test, index).cpu())
            placed.extend(p for i in index for p in self.test.placed[i])
            advance(len(index))
        order = example_order(placed)
        return torch.cat(preds)[order], [placed[i] for i in order]
