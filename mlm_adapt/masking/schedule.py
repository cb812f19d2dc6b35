"""Masking-rate schedules: ``data.mlm_probability`` as a rate or piecewise-linear ``[fraction, rate]`` points.

The rate of a training batch is a function of the fraction of the run's optimizer steps done when the batch
contributes to a step (``step / trainer.estimated_stepping_batches``), nothing else: every DDP rank, every
DataLoader worker and a resumed run compute the same rate for the same batch (see
:mod:`mlm_adapt.data.mask_rates`, which turns loader positions into steps). Published schedules, ready to
copy, are in ``docs/recipe.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mlm_adapt.errors import MLMAdaptError

RateSpec = float | Sequence[Sequence[float]]

_EXAMPLE = "e.g. 0.15 or [[0.0, 0.30], [1.0, 0.15]]"


@dataclass(frozen=True)
class MaskingSchedule:
    """A masking rate over training: ``points`` of ``(fraction_of_training, rate)``, linear in between.

    Before the first point the first rate holds, after the last point the last rate.
    """

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
    value: RateSpec, key: str = "data.mlm_probability", zero_allowed: bool = False, example: str = _EXAMPLE
) -> MaskingSchedule:
    """Reads a rate or a list of ``[fraction_of_training, rate]`` points; bad values give one line.

    Args:
        value: The configured value.
        key: The config key, for messages.
        zero_allowed: Rates may be 0 (a mixing rate), not only in (0, 1) (a masking rate).
        example: A valid value, for messages.

    Raises:
        MLMAdaptError: A rate outside (0, 1) (or [0, 1)), fractions outside [0, 1] or not strictly
            increasing, or a malformed point, naming ``key``.
    """
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
        raise MLMAdaptError(
            f"{key}={value!r} must be a rate or a list of [fraction, rate] points; {example}"
        )
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
    return MaskingSchedule(points)
