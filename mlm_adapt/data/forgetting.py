"""The ``forgetting:`` options (``--forgetting.*``): the warning on a general set's rise, and the budget with
its checks. The data module holds them (its replay moves the replay rate under the budget) and the training
callbacks read them from there, typed; they are checked here, once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlm_adapt.errors import MLMAdaptError


def check_rise_limit(value: float | None, key: str) -> None:
    """``None`` or a finite relative rise > 0 (``NaN`` would compare false with every rise, so the budget or
    warning could never act)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if value is not None and (not number or not 0 < value < math.inf):
        raise MLMAdaptError(f"{key}={value} must be a finite number > 0, e.g. 0.2 (+20% perplexity)")


def _check_count(value: int | None, key: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise MLMAdaptError(f"{key}={value} must be at least 1")


@dataclass(kw_only=True, frozen=True)
class ForgettingOptions:
    """How forgetting of general text is watched and held (``forgetting:`` in a fit config; docs/training.md).

    Args:
        warning: Warn (once per set) when a validation set but the first ends a validation with a
            perplexity this fraction above its step-0 value (e.g. ``0.2``).
        budget: Hold forgetting to this relative rise of the general validation set's perplexity over
            step 0 (``0.2``: +20%) by moving the replay rate (up to ``max_replay_rate``). Needs
            ``data.replay.files`` and a general validation set: the second of ``data.validation_files`` as a
            mapping, with files (a ``null`` set is held out of the corpus: domain text).
        check_interval: Optimizer steps between the budget's checks (default: a twentieth of the run); a
            check is a perplexity over ``check_batches`` batches of the general set.
        check_batches: Batches (of ``data.eval_batch_size``) per check.
        max_replay_rate: The highest replay rate the budget may set.
    """

    warning: float | None = None
    budget: float | None = None
    check_interval: int | None = None
    check_batches: int = 4
    max_replay_rate: float = 0.5

    def check(self) -> ForgettingOptions:
        """Refuses, in one line naming the key, a value the warning or the budget could not act on; returns
        the options. Called where they are taken into use (:func:`~mlm_adapt.options.as_options`), not when
        built: the parser builds them to check their types, and its report of a failure would not be one
        line."""
        check_rise_limit(self.warning, "forgetting.warning")
        check_rise_limit(self.budget, "forgetting.budget")
        _check_count(self.check_interval, "forgetting.check_interval")
        _check_count(self.check_batches, "forgetting.check_batches")
        if not 0.0 < self.max_replay_rate < 1.0:
            raise MLMAdaptError(
                f"forgetting.max_replay_rate={self.max_replay_rate} must be in (0, 1), e.g. 0.5"
            )
        return self
