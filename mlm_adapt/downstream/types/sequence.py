"""The types with one target per text (or text pair), probed on pooled features of the whole row and
fine-tuned as an ``AutoModelForSequenceClassification``: ``sequence_classification`` (one class, scored by
accuracy and macro-F1), ``pair_classification`` (its variant for text pairs) and ``regression`` (one number,
e.g. STS similarity, scored by Pearson and Spearman; a ridge probe, a one-output head with MSE).
"""

from __future__ import annotations

from typing import Any

import datasets
import torch
from torchmetrics.functional import pearson_corrcoef, spearman_corrcoef
from torchmetrics.functional.classification import multiclass_accuracy, multiclass_f1_score
from transformers import AutoModelForSequenceClassification, PretrainedConfig, PreTrainedTokenizerBase

from mlm_adapt.downstream.features import Encoding, Place, Pooling, RidgeProbe
from mlm_adapt.downstream.types.base import (
    ClassificationType,
    DownstreamTask,
    Probe,
    Score,
    TaskSplit,
    bootstrap_std,
    class_label,
    class_names,
    task_key,
)
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.numbers import parse_number


def class_scores(preds: torch.Tensor, labels: torch.Tensor, num_classes: int) -> Score:
    """Accuracy (micro) and macro-F1 (unweighted mean of the per-class F1) of class predictions."""
    return {
        "accuracy": multiclass_accuracy(preds, labels, num_classes, average="micro").item(),
        "macro_f1": multiclass_f1_score(preds, labels, num_classes, average="macro").item(),
    }


def pool(states: torch.Tensor, batch: dict[str, torch.Tensor], pooling: Pooling) -> torch.Tensor:
    """Row features: ``mean`` of the non-special tokens, ``first`` token, or both (computed in float32)."""
    states = states.float()
    mask = (batch["attention_mask"].bool() & ~batch["special_tokens_mask"].bool()).unsqueeze(-1)
    mean = (states * mask).sum(1) / mask.sum(1).clamp(min=1)
    parts = {"mean": [mean], "first": [states[:, 0]], "mean_first": [mean, states[:, 0]]}[pooling]
    return torch.cat(parts, dim=-1)


class SequenceClassification(ClassificationType):
    """One class per text or text pair."""

    name = "sequence_classification"
    default_columns = {"text_column": "text", "text_pair_column": None, "label_column": "label"}
    auto_model = AutoModelForSequenceClassification

    def label(self, value: Any, key: str, files: str) -> Any:
        """The raw label of one cell (checked)."""
        return class_label(value, key, files)

    def read(
        self, table: datasets.Dataset, task: DownstreamTask, index: int, files: str
    ) -> tuple[TaskSplit, list]:
        columns = self.columns(task)
        for key in ("text_column", "text_pair_column"):
            column = columns.get(key)
            if column and not all(isinstance(t, str) for t in table[column]):
                raise MLMAdaptError(
                    f"{task_key(index, key)}: column {column!r} of {files} holds non-text values"
                )
        pair = columns.get("text_pair_column")
        split = TaskSplit(
            texts=list(table[columns["text_column"]]), pairs=list(table[pair]) if pair else None
        )
        key = task_key(index, "label_column")
        return split, [self.label(v, key, files) for v in table[columns["label_column"]]]

    def targets(
        self, train: list, test: list, index: int, task: DownstreamTask
    ) -> tuple[list[str], list, list]:
        names = class_names(train, test, task_key(index, self.label_key), ", ".join(task.train_files))
        index_of = {n: i for i, n in enumerate(names)}
        return names, [index_of[v] for v in train], [index_of[v] for v in test]

    def encode(self, tokenizer: PreTrainedTokenizerBase, split: TaskSplit, max_length: int) -> Encoding:
        # Exactly tokenizer(text, text_pair): [CLS] text [SEP] pair [SEP] with segment ids for BERT.
        out = tokenizer(
            split.texts,
            split.pairs,
            truncation=True,
            split_special_tokens=True,  # text is text, as in training (mlm_adapt.text.alignment)
            max_length=max_length,
            return_special_tokens_mask=True,
        )
        rows = [{k: out[k][i] for k in out} for i in range(len(split))]
        return Encoding(rows=rows, targets=list(split.labels), placed=[[(i, 0)] for i in range(len(split))])

    def select(
        self,
        states: torch.Tensor,
        batch: dict[str, torch.Tensor],
        rows: list[int],
        encoding: Encoding,
        pooling: Pooling,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return pool(states, batch, pooling), torch.tensor([encoding.targets[i] for i in rows])

    def batch_labels(self, encoding: Encoding, rows: list[int], width: int) -> torch.Tensor:
        return torch.tensor([encoding.targets[i] for i in rows])

    def predictions(self, logits: torch.Tensor, encoding: Encoding, rows: list[int]) -> torch.Tensor:
        return logits.argmax(-1)

    def score(
        self, preds: torch.Tensor, placed: list[Place], gold: list, label_names: list[str], bootstrap: int
    ) -> tuple[Score, Score]:
        labels, n = torch.tensor(gold), len(label_names)
        scores = class_scores(preds, labels, n)
        return scores, bootstrap_std(len(labels), lambda i: class_scores(preds[i], labels[i], n), bootstrap)


class PairClassification(SequenceClassification):
    """One class per text pair (CLUE AFQMC, OCNLI, CMNLI): the columns default to CLUE's jsonl
    (``sentence1``, ``sentence2``, ``label``), so those files work as they are."""

    name = "pair_classification"
    default_columns = {"text_column": "sentence1", "text_pair_column": "sentence2", "label_column": "label"}
    required = ("text_pair_column",)


def correlations(preds: torch.Tensor, gold: torch.Tensor) -> Score:
    """Pearson and Spearman correlation of predictions with the gold numbers (0 when either is constant,
    where correlation is undefined)."""
    preds, gold = preds.double(), gold.double()
    if len(gold) < 2 or preds.std() == 0 or gold.std() == 0:
        return {"pearson": 0.0, "spearman": 0.0}
    return {
        "pearson": float(pearson_corrcoef(preds, gold)),
        "spearman": float(spearman_corrcoef(preds, gold)),
    }


class Regression(SequenceClassification):
    """One number per text or text pair."""

    name = "regression"

    def label(self, value: Any, key: str, files: str) -> float:
        return float(
            parse_number(
                value,
                float,
                f"{key}: label {{value}} in {files}",
                "a regression task needs a finite number per example (use sequence_classification for class "
                "names)",
            )
        )

    def targets(
        self, train: list, test: list, index: int, task: DownstreamTask
    ) -> tuple[list[str], list, list]:
        if len(set(train)) < 2:
            raise MLMAdaptError(
                f"{task_key(index, 'label_column')}: the training files {', '.join(task.train_files)} "
                f"hold one value only ({train[0]!r}); a regression task needs varied targets"
            )
        return [], list(train), list(test)

    def probe(self, l2: float) -> Probe:
        return RidgeProbe(l2=l2)

    def configure(self, config: PretrainedConfig, label_names: list[str]) -> None:
        config.num_labels = 1
        config.problem_type = "regression"

    def batch_labels(self, encoding: Encoding, rows: list[int], width: int) -> torch.Tensor:
        return torch.tensor([encoding.targets[i] for i in rows], dtype=torch.float32)

    def predictions(self, logits: torch.Tensor, encoding: Encoding, rows: list[int]) -> torch.Tensor:
        return logits[:, 0].float()

    def score(
        self, preds: torch.Tensor, placed: list[Place], gold: list, label_names: list[str], bootstrap: int
    ) -> tuple[Score, Score]:
        target = torch.tensor(gold, dtype=torch.float64)
        preds = preds.double()
        spread = bootstrap_std(len(target), lambda i: correlations(preds[i], target[i]), bootstrap)
        return correlations(preds, target), spread
