"""Per-batch masking rates of the training loader: loader position -> optimizer step -> scheduled rate.

The sampler runs in the main process and knows each example's position in the epoch, hence its batch and the
optimizer step that batch contributes to (Lightning steps every ``accumulate_grad_batches`` batches and at
the end of an epoch). It attaches the rate to the example key, and the collator (in a worker) masks at that
rate. Positions are the same on every rank, in every worker layout and after an exact resume (the
``StatefulDataLoader`` restores the sampler's position), so the rates -- and masks -- are too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from mlm_adapt.masking.schedule import MaskingSchedule


@dataclass(frozen=True)
class Stepping:
    """How loader batches map to optimizer steps.

    Args:
        batches_per_epoch: Training batches per epoch and rank (``trainer.num_training_batches``).
        accumulate: ``trainer.accumulate_grad_batches``.
        total_steps: Optimizer steps of the run (``trainer.estimated_stepping_batches``).
    """

    batches_per_epoch: int
    accumulate: int
    total_steps: int

    def step(self, epoch: int, batch_in_epoch: int) -> int:
        """The 0-based optimizer step a batch contributes to."""
        steps_per_epoch = math.ceil(self.batches_per_epoch / self.accumulate)
        return epoch * steps_per_epoch + batch_in_epoch // self.accumulate


def trainer_stepping(trainer: Any) -> Stepping:
    """The :class:`Stepping` of a Lightning trainer whose train loader is set up (not inside
    ``train_dataloader``: ``estimated_stepping_batches`` would build the loader again)."""
    return Stepping(
        int(trainer.num_training_batches),
        int(trainer.accumulate_grad_batches),
        int(trainer.estimated_stepping_batches),
    )


class MaskRates:
    """Attaches the scheduled masking rate to the ``(epoch, index)`` keys a sampler yields.

    Args:
        schedule: The masking-rate schedule.
        batch_size: Examples per batch and rank.
        stepping: Called once per epoch, when the sampler starts: the current :class:`Stepping` (lazily,
            because the trainer knows the number of steps only after the loader exists).
    """

    def __init__(self, schedule: MaskingSchedule, batch_size: int, stepping: Callable[[], Stepping]):
        self.schedule = schedule
        self.batch_size = batch_size
        self.stepping = stepping

    def keyed(self, epoch: int, indices: Iterable[int]) -> Iterator[tuple[int, int, float]]:
        """``(epoch, index, rate)`` for this rank's indices of an epoch, in order."""
        stepping = self.stepping()
        rate, last_batch = 0.0, -1
        for position, index in enumerate(indices):
            batch = position // self.batch_size
            if batch != last_batch:
                step = stepping.step(epoch, batch)
                rate, last_batch = self.schedule.rate_at_step(step, stepping.total_steps), batch
            yield epoch, index, rate
