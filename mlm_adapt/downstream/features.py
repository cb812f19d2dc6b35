"""Tokenized task rows, padded batches, and frozen-encoder features of them for the linear probe.

What a row holds and which of its positions become features is the task type's business
(:mod:`mlm_adapt.downstream.types`); this module runs the encoder over the rows once, keeping only the hidden
state the probe reads and storing features in the precision the model runs in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

IGNORE = -100
Pooling = Literal["mean", "first", "mean_first"]
_MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# (example, unit) that one feature or prediction belongs to: unit 0 for a text, the word index for words.
Place = tuple[int, int]
# A task type's choice of feature vectors in a batch: (hidden states, padded batch, row indices, encoding,
# pooling) -> (features [k, dim], targets [k]) for the ``placed`` units of those rows, in row order.
Select = Callable[
    [torch.Tensor, dict[str, torch.Tensor], list[int], "Encoding", Pooling], tuple[torch.Tensor, torch.Tensor]
]


@dataclass
class Encoding:
    """Tokenized rows of one split.

    Attributes:
        rows: Tokenizer output per row (``input_ids``, ``attention_mask``, maybe ``token_type_ids``,
            ``special_tokens_mask``), unpadded.
        targets: Per row: its target (text tasks) or one target per token, ``-100`` where none (word tasks).
        placed: Per row: the ``(example, unit)`` scored in it, in the order its features come out.
    """

    rows: list[dict[str, list[int]]]
    targets: list[Any] = field(default_factory=list)
    placed: list[list[Place]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def units(self) -> int:
        """How many scored units (texts or words) the rows hold."""
        return sum(len(p) for p in self.placed)


def example_order(placed: Sequence[Place]) -> list[int]:
    """Positions of ``placed`` sorted by ``(example, unit)``: results in file order, however rows were
    batched."""
    return sorted(range(len(placed)), key=placed.__getitem__)


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


def layer_states(
    encoder: PreTrainedModel, batch: dict[str, torch.Tensor], layers: Sequence[int]
) -> torch.Tensor:
    """Hidden states ``[batch, tokens, dim × len(layers)]`` of ``layers`` (0: embeddings, -1: the output).

    The default ``[-1]`` asks the encoder for its output only, so one layer's activations are alive at a
    time; other layers need every layer's states of the batch at once (``output_hidden_states``).
    """
    inputs = {k: v for k, v in batch.items() if k in _MODEL_INPUTS}
    if list(layers) == [-1]:
        return encoder(**inputs).last_hidden_state
    hidden = encoder(**inputs, output_hidden_states=True).hidden_states
    return torch.cat([hidden[layer] for layer in layers], dim=-1)


@torch.no_grad()
def extract_features(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    encoding: Encoding,
    select: Select,
    layers: Sequence[int] = (-1,),
    pooling: Pooling = "mean",
    batch_size: int = 64,
    forward_context: Callable[[], AbstractContextManager] | None = None,
    dtype: torch.dtype = torch.float32,
    advance: Callable[[int], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[Place]]:
    """Frozen features of every scored unit of ``encoding`` (a text, or a word's first sub-token).

    Args:
        model: The masked LM (its encoder is used) in any mode; it is put in eval mode (no dropout) and
            restored afterwards.
        tokenizer: Its tokenizer (pads the batches).
        encoding: Rows from the task type's ``encode``.
        select: The task type's choice of features in a batch (pooling, or first sub-tokens).
        layers: Hidden-state indices to concatenate (0: embeddings, -1: the encoder's output).
        pooling: Text tasks: ``mean`` of the non-special tokens, ``first`` token ([CLS]), or
            ``mean_first`` (both, concatenated).
        batch_size: Rows per forward pass.
        forward_context: E.g. the trainer's precision context (autocast), entered around each forward.
        dtype: Storage type of the features (``bfloat16``/``float16`` when the model runs in it: half the
            memory of float32; pooling itself is computed in float32).
        advance: Called with the number of rows after each batch (a progress bar).

    Returns:
        Features ``[n, dim]`` (``dtype``, on CPU), their targets ``[n]`` and the ``(example, unit)`` of each
        row, all sorted by ``(example, unit)``.
    """
    encoder = encoder_of(model)
    device = next(encoder.parameters()).device
    was_training = encoder.training
    encoder.eval()
    feats, targets, placed = [], [], []
    try:
        for index, batch in batches(encoding, tokenizer, batch_size, device):
            with forward_context() if forward_context else nullcontext():
                states = layer_states(encoder, batch, layers)
            chosen, chosen_targets = select(states, batch, index, encoding, pooling)
            feats.append(chosen.to(dtype).cpu())
            targets.append(chosen_targets.cpu())
            placed.extend(p for i in index for p in encoding.placed[i])
            del states
            if advance is not None:
                advance(len(index))
    finally:
        encoder.train(was_training)
    order = torch.tensor(example_order(placed), dtype=torch.long)
    return torch.cat(feats)[order], torch.cat(targets)[order], [placed[i] for i in order.tolist()]
