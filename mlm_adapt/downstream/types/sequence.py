"""``sequence_classification``: one class per text (or per text pair when ``text_pair_column`` is set).

Scored by accuracy and macro-F1; the probe reads pooled features of the whole row; a fine-tune trains an
``AutoModelForSequenceClassification`` head. The pair and regression types build on this one.
"""

from __future__ import annotations

from typing import Any

import datasets
import torch
from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerBase

from mlm_adapt.downstream.features import Encoding, Place, Pooling
from mlm_adapt.downstream.scores import Score, bootstrap_std, class_scores
from mlm_adapt.downstream.spec import DownstreamTask, TaskSplit, task_key
from mlm_adapt.downstream.types.base import ClassificationType, class_label, class_names
from mlm_adapt.errors import MLMAdaptError


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
