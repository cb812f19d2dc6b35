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

from mlm_adapt.errors import MLMAdaptError
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


def trainer_stepping(trainer: Any, loader_batches: int) -> Stepping:
    """The :class:`Stepping` of a Lightning trainer for a train loader of ``loader_batches`` batches.

    Computed from the trainer's settings with Lightning's own rules (``limit_train_batches``, a step at the
    end of every epoch, ``estimated_stepping_batches``) rather than read from ``num_training_batches``: an
    exact resume fast-forwards the sampler before Lightning has counted the batches.

    Raises:
        MLMAdaptError: When the run has no length (``max_steps`` and ``max_epochs`` both unlimited).
    """
    limit = trainer.limit_train_batches
    batches = min(loader_batches, limit) if isinstance(limit, int) else int(loader_batches * limit)
    accumulate = int(trainer.accumulate_grad_batches)
    max_steps, max_epochs = trainer.max_steps, trainer.max_epochs
    if max_epochs is None or max_epochs == -1:
        if max_steps is None or max_steps < 0:
            raise MLMAdaptError(
                "data.mlm_probability: a masking-rate schedule needs a run length; "
                "set trainer.max_steps or trainer.max_epochs"
            )
        total = max_steps
    else:
        total = math.ceil(batches / accumulate) * max(max_epochs, 1)
        total = min(total, max_steps) if max_steps is not None and max_steps != -1 else total
    return Stepping(batches, accumulate, int(total))


class MaskRates:
    """Attaches the scheduled masking rate to the ``(epoch, index)`` keys a sampler yields.

    Args:
        schedule: The masking-rate schedule.
        batch_size: Examples per batch and rank.
        stepping: Called once per epoch with the number of loader batches: the :class:`Stepping`.
    """

    def __init__(self, schedule: MaskingSchedule, batch_size: int, stepping: Callable[[int], Stepping]):
        self.schedule = schedule
        self.batch_size = batch_size
        self.stepping = stepping

    def keyed(self, epoch: int, indices: Iterable[int], n_indices: int) -> Iterator[tuple[int, int, float]]:
        """``(epoch, index, rate)`` for this rank's ``n_indices`` indices of an epoch, in order."""
        stepping = self.stepping(math.ceil(n_indices / self.batch_size))
        rate, last_batch = 0.0, -1
        for position, index in enumerate(indices):
            batch = position // self.batch_size
            if batch != last_batch:
                step = stepping.step(epoch, batch)
                rate, last_batch = self.schedule.rate_at_step(step, stepping.total_steps), batch
            yield epoch, index, rate
