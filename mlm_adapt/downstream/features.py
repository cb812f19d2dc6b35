"""Tokenized task rows, padded batches, frozen-encoder features of them, and the probes fitted on those
(what a row holds and which positions become features is the task type's business).

The probes (logistic regression for classes, ridge regression for numbers) are solved to their optimum
(full-batch L-BFGS on a convex loss, or in closed form) in float64 on standardized features, so the result
depends on the features only (no seed, learning rate or epoch count), which makes probe scores of two
checkpoints comparable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

IGNORE = -100
Pooling = Literal["mean", "first", "mean_first"]
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# (example, unit) that one feature or prediction belongs to: unit 0 for a text, the word index for words.
Place = tuple[int, int]
# Makes the context each forward pass runs in (e.g. the trainer's autocast).
ForwardContext = Callable[[], AbstractContextManager]


@dataclass
class Encoding:
    """Tokenized rows of one split.

    Attributes:
        rows: Tokenizer output per row (with ``special_tokens_mask``), unpadded.
        targets: Per row: its target (text tasks) or one target per token, ``-100`` where none (word tasks).
        placed: Per row: the ``(example, unit)`` scored in it, in the order its features come out.
    """

    rows: list[dict[str, list[int]]]
    targets: list[Any] = field(default_factory=list)
    placed: list[list[Place]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)


def example_order(placed: Sequence[Place]) -> list[int]:
    """Positions of ``placed`` sorted by ``(example, unit)``: results in file order, however rows were
    batched."""
    return sorted(range(len(placed)), key=placed.__getitem__)


def pad(
    encoding: Encoding,
    index: list[int],
    tokenizer: PreTrainedTokenizerBase,
    device: torch.device,
    keys: Sequence[str] | None = None,
) -> dict[str, torch.Tensor]:
    """The rows ``index`` as one padded batch on ``device`` (only its ``keys``, if given)."""
    batch = tokenizer.pad([encoding.rows[i] for i in index], return_tensors="pt")
    return {k: v.to(device) for k, v in batch.items() if keys is None or k in keys}


def batches(
    encoding: Encoding, tokenizer: PreTrainedTokenizerBase, batch_size: int, device: torch.device
) -> Iterator[tuple[list[int], dict[str, torch.Tensor]]]:
    """Padded batches of rows of similar length (less padding), with the row indices of each batch."""
    order = sorted(range(len(encoding)), key=lambda i: len(encoding.rows[i]["input_ids"]))
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        yield index, pad(encoding, index, tokenizer, device)


def encoder_of(model: PreTrainedModel) -> PreTrainedModel:
    """The transformer without its pretraining head (``BertForMaskedLM.bert``); the head's vocabulary
    projection is not needed for features and is the costliest layer of a small model."""
    return getattr(model, "base_model", model)


def layer_states(
    encoder: PreTrainedModel, batch: dict[str, torch.Tensor], layers: Sequence[int]
) -> torch.Tensor:
    """Hidden states ``[batch, tokens, dim × len(layers)]`` of ``layers`` (0: embeddings, -1: the output).
    Only ``[-1]`` keeps one layer's activations alive at a time; others need ``output_hidden_states``."""
    inputs = {k: v for k, v in batch.items() if k in MODEL_INPUTS}
    if list(layers) == [-1]:
        return encoder(**inputs).last_hidden_state
    hidden = encoder(**inputs, output_hidden_states=True).hidden_states
    return torch.cat([hidden[layer] for layer in layers], dim=-1)


@torch.no_grad()
def extract_features(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    encoding: Encoding,
    select: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    layers: Sequence[int] = (-1,),
    pooling: Pooling = "mean",
    batch_size: int = 64,
    forward_context: ForwardContext = nullcontext,
    dtype: torch.dtype = torch.float32,
    advance: Callable[[int], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[Place]]:
    """Features ``[n, dim]`` (``dtype``, on CPU) of every scored unit of ``encoding`` (a text, or a word's
    first sub-token), their targets ``[n]`` and ``(example, unit)``, sorted by the latter.

    The encoder runs in eval mode (no dropout; its mode is restored afterwards). ``select`` is the task
    type's, ``advance`` is called with the rows of each batch; the other arguments are
    :meth:`~mlm_adapt.downstream.evaluate.TaskEvaluator.linear_probe`'s.
    """
    encoder = encoder_of(model)
    device = next(encoder.parameters()).device
    was_training = encoder.training
    encoder.eval()
    feats, targets, placed = [], [], []
    try:
        for index, batch in batches(encoding, tokenizer, batch_size, device):
            with forward_context():
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


class _Standardized:
    """Features standardized with the training statistics (float64)."""

    mean: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    weight: torch.Tensor | None = None

    def _standardize(self, x: torch.Tensor, fit: bool = False) -> torch.Tensor:
        x = x.double()
        if fit:
            self.mean, self.scale = x.mean(0), x.std(0).clamp(min=1e-6)
        elif self.weight is None:
            raise RuntimeError(f"{type(self).__name__}.predict before fit")
        return (x - self.mean) / self.scale


class LinearProbe(_Standardized):
    """Multinomial logistic regression ``softmax(x W + b)``, trained to convergence.

    Args:
        l2: Weight of ``0.5 * ||W||^2`` added to the mean cross-entropy (the bias is not penalized).
        max_iter: L-BFGS iterations at most; it stops earlier when the gradient or loss change vanishes.
        tolerance: Gradient tolerance (max absolute component) that counts as converged.
    """

    def __init__(self, l2: float = 1e-3, max_iter: int = 500, tolerance: float = 1e-6):
        self.l2 = l2
        self.max_iter = max_iter
        self.tolerance = tolerance
        self.bias: torch.Tensor | None = None
        self.iterations = 0

    def fit(self, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> LinearProbe:
        """Fits the probe on features ``x`` ``[n, dim]`` and class indices ``y`` ``[n]``."""
        # float64: L-BFGS converges to the same optimum in far fewer, more reproducible iterations.
        z, y = self._standardize(x, fit=True), y.long()
        weight = torch.zeros(z.shape[1], num_classes, dtype=torch.float64, requires_grad=True)
        bias = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.LBFGS(
            [weight, bias],
            lr=1.0,
            max_iter=self.max_iter,
            tolerance_grad=self.tolerance,
            tolerance_change=1e-12,
            history_size=20,
            line_search_fn="strong_wolfe",
        )

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = F.cross_entropy(z @ weight + bias, y) + 0.5 * self.l2 * weight.pow(2).sum()
            loss.backward()
            return loss

        with torch.enable_grad():
            optimizer.step(closure)
        self.iterations = optimizer.state[optimizer._params[0]]["n_iter"]
        self.weight, self.bias = weight.detach(), bias.detach()
        return self

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Class index of each row of ``x``."""
        return (self._standardize(x) @ self.weight + self.bias).argmax(-1)


class RidgeProbe(_Standardized):
    """Ridge regression on standardized features and targets, solved exactly.

    Args:
        l2: Weight of ``0.5 * ||w||^2`` added to half the mean squared error (the bias is not penalized).
    """

    def __init__(self, l2: float = 1e-3):
        self.l2 = l2
        self.target_mean = 0.0
        self.target_scale = 1.0

    def fit(self, x: torch.Tensor, y: torch.Tensor, num_labels: int = 0) -> RidgeProbe:
        """Fits ``y ≈ x w + b`` on features ``x`` ``[n, dim]`` and numbers ``y`` ``[n]``."""
        z, y = self._standardize(x, fit=True), y.double()
        self.target_mean, self.target_scale = float(y.mean()), max(float(y.std()), 1e-12)
        t = (y - self.target_mean) / self.target_scale
        gram = z.T @ z / len(z) + self.l2 * torch.eye(z.shape[1], dtype=torch.float64)
        self.weight = torch.linalg.solve(gram, z.T @ t / len(z))
        return self

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """The predicted number of each row of ``x``."""
        return self._standardize(x) @ self.weight * self.target_scale + self.target_mean
