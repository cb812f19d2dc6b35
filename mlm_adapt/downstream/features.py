"""Tokenizing task examples once, and frozen-encoder features of them for the linear probe.

Sequence tasks: one row per example (``text`` or ``text, text_pair``), truncated to ``max_length``.
Token tasks: words are tokenized as pre-split words; examples longer than ``max_length`` tokens continue in
further rows (``return_overflowing_tokens``), so every word is scored, not only the first ``max_length``.
A word's label sits on its FIRST sub-token (the usual alignment for BERT taggers); the other sub-tokens,
special tokens and padding get ``-100`` and are neither trained on nor scored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

IGNORE = -100
Pooling = Literal["mean", "first", "mean_first"]
_MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class Encoding:
    """Tokenized rows of one split.

    Attributes:
        rows: Tokenizer output per row (``input_ids``, ``attention_mask``, maybe ``token_type_ids``,
            ``special_tokens_mask``), unpadded.
        targets: Sequence tasks: the label of each row. Token tasks: per row, one label per token
            (``-100`` where no word starts).
        words: Token tasks: per row, ``(example, word)`` of each labelled token, in token order.
        token_level: Whether rows come from a token task (:func:`encode_words`).
    """

    rows: list[dict[str, list[int]]]
    token_level: bool = False
    targets: list = field(default_factory=list)
    words: list[list[tuple[int, int]]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)


def encode_sequences(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    labels: Sequence[int],
    max_length: int,
) -> Encoding:
    """One row per example; pairs are encoded as ``[CLS] text [SEP] pair [SEP]`` with segment ids."""
    out = tokenizer(
        list(texts),
        list(pairs) if pairs is not None else None,
        truncation=True,
        max_length=max_length,
        return_special_tokens_mask=True,
        split_special_tokens=True,  # text is text, as in training (mlm_adapt.text.alignment)
    )
    rows = [{k: out[k][i] for k in out} for i in range(len(texts))]
    return Encoding(rows=rows, targets=list(labels))


def encode_words(
    tokenizer: PreTrainedTokenizerBase,
    words: Sequence[Sequence[str]],
    labels: Sequence[Sequence[int]],
    max_length: int,
) -> Encoding:
    """Rows of pre-split words with each word's label on its first sub-token (long examples overflow into
    more rows). Words that tokenize to nothing (e.g. a space) get no row position."""
    out = tokenizer(
        [list(w) for w in words],
        is_split_into_words=True,
        truncation=True,
        max_length=max_length,
        return_overflowing_tokens=True,
        return_special_tokens_mask=True,
        split_special_tokens=True,
    )
    mapping = out["overflow_to_sample_mapping"]
    keys = [k for k in out if k != "overflow_to_sample_mapping"]
    encoding = Encoding(rows=[], token_level=True)
    seen: set[tuple[int, int]] = set()
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
        encoding.words.append(placed)
    return encoding


def batches(
    encoding: Encoding, tokenizer: PreTrainedTokenizerBase, batch_size: int, device: torch.device
) -> Iterator[tuple[list[int], dict[str, torch.Tensor]]]:
    """Padded batches of rows of similar length (less padding), with the row indices of each batch."""
    order = sorted(range(len(encoding)), key=lambda i: len(encoding.rows[i]["input_ids"]))
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        batch = tokenizer.pad([encoding.rows[i] for i in index], return_tensors="pt")
        yield index, {k: v.to(device) for k, v in batch.items()}


def encoder_of(model: PreTrainedModel) -> PreTrainedModel:
    """The transformer without its pretraining head (``BertForMaskedLM.bert``); the head's vocabulary
    projection is not needed for features and is the costliest layer of a small model."""
    return getattr(model, "base_model", model)


def _layer_states(
    encoder: PreTrainedModel, batch: dict[str, torch.Tensor], layers: Sequence[int]
) -> torch.Tensor:
    inputs = {k: v for k, v in batch.items() if k in _MODEL_INPUTS}
    hidden = encoder(**inputs, output_hidden_states=True).hidden_states
    return torch.cat([hidden[layer] for layer in layers], dim=-1).float()


@torch.no_grad()
def extract_features(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    encoding: Encoding,
    layers: Sequence[int] = (-1,),
    pooling: Pooling = "mean",
    batch_size: int = 64,
    forward_context: Callable[[], AbstractContextManager] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
    """Frozen features of every row (sequence tasks) or every labelled token (token tasks).

    Args:
        model: The masked LM (its encoder is used) in any mode; it is put in eval mode (no dropout) and
            restored afterwards.
        tokenizer: Its tokenizer (pads the batches).
        encoding: Rows from :func:`encode_sequences` or :func:`encode_words` (token tasks: features of
            each word's first sub-token instead of pooled rows).
        layers: Hidden-state indices to concatenate (0: embeddings, -1: last layer).
        pooling: Sequence tasks: ``mean`` of the non-special tokens, ``first`` token ([CLS]), or
            ``mean_first`` (both, concatenated).
        batch_size: Rows per forward pass.
        forward_context: E.g. the trainer's precision context (autocast), entered around each forward.

    Returns:
        Features ``[n, dim]`` (float32, on CPU), their labels ``[n]`` and, for token tasks, the
        ``(example, word)`` of each feature row.
    """
    encoder = encoder_of(model)
    device = next(encoder.parameters()).device
    was_training = encoder.training
    encoder.eval()
    feats, labels, words = [], [], []
    try:
        for index, batch in batches(encoding, tokenizer, batch_size, device):
            with forward_context() if forward_context else nullcontext():
                states = _layer_states(encoder, batch, layers)
            if encoding.token_level:
                for row, i in enumerate(index):
                    targets = torch.tensor(encoding.targets[i], device=device)
                    keep = targets != IGNORE
                    feats.append(states[row, : len(targets)][keep].cpu())
                    labels.append(targets[keep].cpu())
                    words.extend(encoding.words[i])
                continue
            mask = (batch["attention_mask"].bool() & ~batch["special_tokens_mask"].bool()).unsqueeze(-1)
            mean = (states * mask).sum(1) / mask.sum(1).clamp(min=1)
            pooled = {"mean": [mean], "first": [states[:, 0]], "mean_first": [mean, states[:, 0]]}[pooling]
            feats.append(torch.cat(pooled, dim=-1).cpu())
            labels.append(torch.tensor([encoding.targets[i] for i in index]))
            words.extend((i, 0) for i in index)
    finally:
        encoder.train(was_training)
    features, targets = torch.cat(feats), torch.cat(labels)
    if not encoding.token_level:  # back to example order
        order = torch.tensor([w[0] for w in words]).argsort()
        features, targets, words = features[order], targets[order], []
    return features, targets, words
