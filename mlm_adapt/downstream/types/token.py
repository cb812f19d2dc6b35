"""``token_classification``: one BIO tag per word (NER, chunking), scored by entity-level F1 (exact span and
type, micro-averaged over entities, as conlleval/seqeval) and word ``accuracy``.

A word's label sits on its FIRST sub-token (the usual alignment for BERT taggers); the other sub-tokens,
special tokens and padding get ``-100`` and are neither trained on nor scored.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import datasets
import torch
from transformers import AutoModelForTokenClassification, PreTrainedTokenizerBase

from mlm_adapt.downstream.features import IGNORE, Encoding, Place, Pooling
from mlm_adapt.downstream.types.base import (
    ClassificationType,
    DownstreamTask,
    Score,
    TaskSplit,
    bootstrap_std,
    class_label,
    class_names,
    task_key,
)
from mlm_adapt.errors import MLMAdaptError

# Tags entity-level F1 understands (BIO/IOB2): anything else would score 0 without a word.
BIO_TAG = re.compile(r"O|[BI]-.+")


def entity_spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """``(type, start, end)`` entities of a BIO/IOB2 sequence (``end`` exclusive); as in conlleval/seqeval's
    default mode, an ``I-X`` that does not continue an ``X`` entity starts one."""
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


def token_scores(
    pred: Sequence[Sequence[int]], gold: Sequence[Sequence[int]], label_names: Sequence[str]
) -> tuple[Score, torch.Tensor]:
    """Entity-level F1 and word accuracy of tag predictions, and per sentence the counts ``[correct
    entities, predicted entities, gold entities, correct words, words]`` (for resampling)."""
    rows = []
    for pred_ids, gold_ids in zip(pred, gold, strict=True):
        p = entity_spans([label_names[i] for i in pred_ids])
        g = entity_spans([label_names[i] for i in gold_ids])
        right = sum(a == b for a, b in zip(pred_ids, gold_ids, strict=True))
        rows.append((len(p & g), len(p), len(g), right, len(gold_ids)))
    counts = torch.tensor(rows, dtype=torch.float64).reshape(-1, 5)
    return scores_from_counts(counts), counts


def scores_from_counts(counts: torch.Tensor) -> Score:
    """Micro entity-level F1 (0 when there is nothing to match) and word accuracy of summed counts."""
    correct, predicted, gold, right, words = counts.sum(0).tolist()
    return {
        "f1": 2 * correct / (predicted + gold) if predicted + gold else 0.0,
        "accuracy": right / words if words else 0.0,
    }


def encode_words(
    tokenizer: PreTrainedTokenizerBase, words: list[list[str]], labels: list[list[int]], max_length: int
) -> Encoding:
    """Rows of pre-split words with each word's label on its first sub-token (long examples overflow into
    more rows). Words that tokenize to nothing (e.g. a space) get no row position."""
    out = tokenizer(
        [list(w) for w in words],
        is_split_into_words=True,
        truncation=True,
        split_special_tokens=True,  # text is text, as in training (mlm_adapt.text.alignment)
        max_length=max_length,
        return_overflowing_tokens=True,
        return_special_tokens_mask=True,
    )
    mapping = out["overflow_to_sample_mapping"]
    keys = [k for k in out if k != "overflow_to_sample_mapping"]
    encoding = Encoding(rows=[])
    seen: set[Place] = set()
    for row, example in enumerate(mapping):
        targets, placed = [], []
        for word in out.word_ids(row):
            if word is None or (example, word) in seen:
                targets.append(IGNORE)
                continue
            seen.add((example, word))
            targets.append(labels[example][word])
            placed.append((example, word))
        encoding.rows.append({k: out[k][row] for k in keys})
        encoding.targets.append(targets)
        encoding.placed.append(placed)
    return encoding


class TokenClassification(ClassificationType):
    """One tag per word."""

    name = "token_classification"
    default_columns = {"tokens_column": "tokens", "tags_column": "tags"}
    label_key = "tags_column"
    auto_model = AutoModelForTokenClassification

    def read(
        self, table: datasets.Dataset, task: DownstreamTask, index: int, files: str
    ) -> tuple[TaskSplit, list]:
        columns = self.columns(task)
        tokens, tags = columns["tokens_column"], columns["tags_column"]
        split, raw = TaskSplit(), []
        for row, (words, labels) in enumerate(zip(table[tokens], table[tags], strict=True)):
            if not isinstance(words, list) or not isinstance(labels, list):
                raise MLMAdaptError(
                    f"{task_key(index, 'tokens_column')}: example {row} of {files}: "
                    f"{tokens!r} and {tags!r} must be lists (one tag per word)"
                )
            if len(words) != len(labels):
                raise MLMAdaptError(
                    f"{task_key(index, 'tags_column')}: example {row} of {files} has {len(words)} "
                    f"{tokens} but {len(labels)} {tags}; give one tag per word"
                )
            split.words.append([str(w) for w in words])
            raw.append([class_label(t, task_key(index, "tags_column"), files) for t in labels])
        return split, raw

    def targets(
        self, train: list, test: list, index: int, task: DownstreamTask
    ) -> tuple[list[str], list, list]:
        flat_train = [t for tags in train for t in tags]
        flat_test = [t for tags in test for t in tags]
        # The "outside" tag first: index 0 is what words without a row position are predicted as.
        key, files = task_key(index, self.label_key), ", ".join(task.train_files)
        names = class_names(flat_train, flat_test, key, files, first="O")
        wrong = [t for t in names if not BIO_TAG.fullmatch(t)]
        if wrong:
            raise MLMAdaptError(
                f"{key}: tag {wrong[0]!r} in {files} is not BIO (O, B-TYPE, I-TYPE), so entity F1 would be "
                "0; convert the tags (BIOES: S- to B-, E- to I-; IO: TYPE to I-TYPE)"
            )
        index_of = {n: i for i, n in enumerate(names)}
        return names, *([[index_of[t] for t in tags] for tags in raw] for raw in (train, test))

    def encode(self, tokenizer: PreTrainedTokenizerBase, split: TaskSplit, max_length: int) -> Encoding:
        return encode_words(tokenizer, split.words, split.labels, max_length)

    def batch_labels(self, encoding: Encoding, rows: list[int], width: int) -> torch.Tensor:
        labels = torch.full((len(rows), width), IGNORE)
        for row, i in enumerate(rows):
            labels[row, : len(encoding.targets[i])] = torch.tensor(encoding.targets[i])
        return labels

    def select(
        self,
        states: torch.Tensor,
        batch: dict[str, torch.Tensor],
        rows: list[int],
        encoding: Encoding,
        pooling: Pooling,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        labels = self.batch_labels(encoding, rows, states.shape[1])
        keep = (labels != IGNORE).to(states.device)
        return states[keep], labels[keep.cpu()]

    def predictions(self, logits: torch.Tensor, encoding: Encoding, rows: list[int]) -> torch.Tensor:
        keep = self.batch_labels(encoding, rows, logits.shape[1]) != IGNORE
        return logits[keep.to(logits.device)].argmax(-1)

    def score(
        self, preds: torch.Tensor, placed: list[Place], gold: list, label_names: list[str], bootstrap: int
    ) -> tuple[Score, Score]:
        # Words without a position (they tokenize to nothing) are predicted as the first label, "O" if any.
        pred = [[0] * len(tags) for tags in gold]
        for (example, word), label in zip(placed, preds.tolist(), strict=True):
            pred[example][word] = label
        scores, counts = token_scores(pred, gold, label_names)
        return scores, bootstrap_std(len(pred), lambda i: scores_from_counts(counts[i]), bootstrap)
