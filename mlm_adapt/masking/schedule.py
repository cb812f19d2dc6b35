"""The masking rate, from the config to each example: ``data.masking.mlm_probability`` as a rate or a
schedule.

1. :func:`parse_schedule` reads ``data.masking.mlm_probability`` (a rate, or piecewise-linear
   ``[fraction_of_training, rate]`` points) into a :class:`RateSchedule`, once, when the DataModule is
   built.
2. The training sampler (``mlm_adapt.data.samplers.EpochSampler``, in the main process) knows each
   example's position in the epoch, hence the optimizer step its batch feeds (:class:`Stepping`, from
   :func:`trainer_stepping`); under a schedule that is not constant, :class:`ScheduledRates` turns each
   position into an :class:`ExampleKey` carrying the rate of that step.
3. ``KeyedDataset`` passes the key's ``mlm_probability`` on with the example, and the collator (in a
   DataLoader worker) masks each example at its own rate; a constant schedule needs no key.
4. The module logs the realized rate as ``train/mlm_probability``.

The rate of a batch is therefore a function of the fraction of the run's optimizer steps done when it
feeds a step, nothing else: every DDP rank, every worker layout and a resumed run (the
``StatefulDataLoader`` restores the sampler's position) compute the same rate for the same batch.
Published schedules: ``docs/recipe.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from mlm_adapt.errors import MLMAdaptError

RateSpec = float | Sequence[Sequence[float]]

_EXAMPLE = "e.g. 0.15 or [[0.0, 0.30], [1.0, 0.15]]"


@dataclass(frozen=True)
class RateSchedule:
    """A rate over training (the masking rate, the replay rate): ``points`` of ``(fraction_of_training,
    rate)``, linear in between, constant before the first point and after the last."""

    points: tuple[tuple[float, float], ...]

    @property
    def constant(self) -> bool:
        """One rate for the whole run (a plain number in the configuration)."""
        return len({rate for _, rate in self.points}) == 1

    @property
    def initial_rate(self) -> float:
        """The rate at the first step."""
        return self.rate(0.0)

    def rate(self, fraction: float) -> float:
        """The masking rate after ``fraction`` (0..1) of the optimizer steps."""
        points = self.points
        if fraction <= points[0][0]:
            return points[0][1]
        for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
            if fraction <= x1:
                return y0 + (y1 - y0) * (fraction - x0) / (x1 - x0)
        return points[-1][1]

    def rate_at_step(self, step: int, total_steps: int) -> float:
        """The rate of optimizer step ``step`` (0-based) of ``total_steps``."""
        return self.rate(min(max(step / max(total_steps, 1), 0.0), 1.0))

    def describe(self) -> str:
        """A one-line summary for model cards and logs, e.g. ``0.3 at 0% -> 0.15 at 100% (linear)``."""
        if self.constant:
            return f"{self.points[0][1]:g}"
        steps = " -> ".join(f"{rate:g} at {fraction:.0%}" for fraction, rate in self.points)
        return f"{steps} of the optimizer steps (piecewise linear)"


def parse_schedule(
    value: RateSpec,
    key: str = "data.masking.mlm_probability",
    zero_allowed: bool = False,
    example: str = _EXAMPLE,
) -> RateSchedule:
    """Reads a rate or a list of ``[fraction_of_training, rate]`` points; a bad value (a rate outside
    (0, 1), or [0, 1) with ``zero_allowed``, fractions outside [0, 1] or not increasing, a malformed point)
    is one line naming ``key``, with ``example``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        points = ((0.0, float(value)),)
    elif isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0:
        try:
            points = tuple((float(f), float(r)) for f, r in value)
        except (TypeError, ValueError):
            raise MLMAdaptError(
                f"{key}={value!r}: every point must be a [fraction_of_training, rate] pair; {example}"
            ) from None
    else:
        raise MLMAdaptError(f"{key}={value!r} must be a rate or a list of [fraction, rate] points; {example}")
    for fraction, rate in points:
        lowest_ok = rate >= 0.0 if zero_allowed else rate > 0.0
        if not lowest_ok or not rate < 1.0 or math.isnan(rate):
            interval = "[0, 1)" if zero_allowed else "(0, 1)"
            raise MLMAdaptError(f"{key}: rate {rate} must be in {interval}; {example}")
        if not 0.0 <= fraction <= 1.0 or math.isnan(fraction):
            raise MLMAdaptError(f"{key}: fraction {fraction} must be in [0, 1] (of the optimizer steps)")
    fractions = [f for f, _ in points]
    if any(b <= a for a, b in zip(fractions, fractions[1:], strict=False)):
        raise MLMAdaptError(f"{key}: fractions {fractions} must be strictly increasing; {example}")
    return RateSchedule(points)


class ExampleKey(NamedTuple):
    """What the training sampler yields for one example: its epoch and index (the masking hash's inputs) and,
    under a masking-rate schedule, the rate of the optimizer step its batch feeds."""

    epoch: int
    index: int
    mlm_probability: float | None = None


@dataclass(frozen=True)
class Stepping:
    """How loader batches (``batches_per_epoch`` per epoch and rank, ``accumulate`` per step) map to the
    run's ``total_steps`` optimizer steps."""

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
    exact resume fast-forwards the sampler before Lightning has counted the batches. A run without a length
    (``max_steps`` and ``max_epochs`` both unlimited) is an error.
    """
    limit = trainer.limit_train_batches
    batches = min(loader_batches, limit) if isinstance(limit, int) else int(loader_batches * limit)
    accumulate = int(trainer.accumulate_grad_batches)
    max_steps, max_epochs = trainer.max_steps, trainer.max_epochs
    if max_epochs is None or max_epochs == -1:
        if max_steps is None or max_steps < 0:
            raise MLMAdaptError(
                "data.masking.mlm_probability: a masking-rate schedule needs a run length; "
                "set trainer.max_steps or trainer.max_epochs"
            )
        total = max_steps
    else:
        total = math.ceil(batches / accumulate) * max(max_epochs, 1)
        total = min(total, max_steps) if max_steps is not None and max_steps != -1 else total
    return Stepping(batches, accumulate, int(total))


class ScheduledRates:
    """Turns the indices a sampler draws into :class:`ExampleKey` s carrying the rate of ``schedule``.

    ``batch_size`` is per rank; ``stepping`` gives the :class:`Stepping` for an epoch's number of batches.
    """

    def __init__(self, schedule: RateSchedule, batch_size: int, stepping: Callable[[int], Stepping]):
        self.schedule = schedule
        self.batch_size = batch_size
        self.stepping = stepping

    def keyed(
        self, epoch: int, indices: Iterable[int], n_indices: int, first_position: int = 0
    ) -> Iterator[ExampleKey]:
        """The keys of this rank's ``n_indices`` indices of an epoch, in order, the first of them at
        ``first_position`` of the epoch (after a resume on another number of ranks)."""
        stepping = self.stepping(math.ceil(n_indices / self.batch_size))
        rate, last_batch = 0.0, -1
        for position, index in enumerate(indices, start=first_position):
            batch = position // self.batch_size
            if batch != last_batch:
                step = stepping.step(epoch, batch)
                rate, last_batch = self.schedule.rate_at_step(step, stepping.total_steps), batch
            yield ExampleKey(epoch, index, rate)
