"""Training throughput: tokens/s, samples/s, padding and model-FLOPs utilization, via Lightning's utilities.

:class:`MLMThroughputMonitor` is Lightning's ``ThroughputMonitor`` fed with what matters for masked-LM
batches: samples, *real* (non-padding) tokens, and the FLOPs of each batch as counted by
:func:`mlm_flops` (the module exposes them as ``flops_per_batch``). On a GPU whose peak Lightning knows
(A100, H100, H200, ...) it also logs ``train/device/mfu``. It logs every ``log_every_n_steps``, over a
sliding window of ``window_size`` batches:

- ``train/device/samples_per_sec``, ``train/device/batches_per_sec``
- ``train/device/items_per_sec``: non-padding tokens per second
- ``train/device/flops_per_sec`` and, on known GPUs, ``train/device/mfu``
- ``train/non_pad_fraction``: share of real tokens in each batch (logged every step)
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from typing_extensions import override


def mlm_flops(
    config: Any, batch_size: int, seq_len: int, n_predicted: int, backward: bool = True
) -> int | None:
    """Matmul FLOPs of one BERT-style masked-LM step (the usual 6ND-style count, attention included).

    Per token and layer: ``2 * (4 h^2 + 2 h I)`` for the projections and feed-forward, ``4 L h`` for the
    attention scores and weighted sum; the head costs ``2 * (h^2 + h V)`` per predicted position. A backward
    pass costs twice the forward. Embedding lookups, norms and softmax are negligible and left out.

    Args:
        config: The model config (``hidden_size``, ``num_hidden_layers``, ``intermediate_size``,
            ``vocab_size``).
        batch_size: Sequences in the batch.
        seq_len: Padded sequence length (padding is computed, so it is counted).
        n_predicted: Positions that go through the vocabulary head (masked positions with the masked-only
            head, ``batch_size * seq_len`` with the full head).
        backward: Count the backward pass too (training) or only the forward (evaluation).

    Returns:
        The FLOPs, or ``None`` when the config lacks one of the sizes.
    """
    try:
        h, layers = int(config.hidden_size), int(config.num_hidden_layers)
        inter, vocab = int(config.intermediate_size), int(config.vocab_size)
    except (AttributeError, TypeError):
        return None
    tokens = batch_size * seq_len
    encoder = tokens * layers * (2 * (4 * h * h + 2 * h * inter) + 4 * seq_len * h)
    head = n_predicted * 2 * (h * h + h * vocab)
    return (encoder + head) * (3 if backward else 1)


def _samples(batch: dict[str, torch.Tensor]) -> int:
    return int(batch["input_ids"].shape[0])


def _real_tokens(batch: dict[str, torch.Tensor]) -> int:
    return int(batch["attention_mask"].sum())


class MLMThroughputMonitor(ThroughputMonitor):
    """Logs samples/s, non-padding tokens/s, FLOPs/s, MFU (on known GPUs) and the non-padding fraction.

    Args:
        window_size: Batches in the sliding window the rates are computed over.
        separator: Separator in the logged metric names.
    """

    def __init__(self, window_size: int = 20, separator: str = "/"):
        super().__init__(_samples, _real_tokens, window_size=window_size, separator=separator)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *args: Any
    ) -> None:
        mask = batch["attention_mask"]
        pl_module.log("train/non_pad_fraction", mask.float().mean(), batch_size=mask.shape[0])
        super().on_train_batch_end(trainer, pl_module, outputs, batch, *args)
