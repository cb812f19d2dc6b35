"""The ``forgetting:`` options (``--forgetting.*``): the warning on a general set's rise, and the budget with
its checks. The data module holds them (its replay moves the mix rate under the budget) and the training
callbacks read them from there, typed; they are checked here, once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

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
            step 0 (``0.2``: +20%) by moving the mix rate (up to ``data.max_mix_rate``). Needs
            ``data.mix_files`` and a general validation set: the second of ``data.validation_files`` as a
            mapping, with files (a ``null`` set is held out of the corpus: domain text).
        check_interval: Optimizer steps between the budget's checks (default: a twentieth of the run); a
            check is a perplexity over ``check_batches`` batches of the general set.
        check_batches: Batches (of ``data.eval_batch_size``) per check.
    """

    warning: float | None = None
    budget: float | None = None
    check_interval: int | None = None
    check_batches: int = 4

    def check(self) -> ForgettingOptions:
        """Refuses, in one line naming the key, a value the warning or the budget could not act on; returns
        the options. Called where they are taken into use (:func:`as_forgetting`), not when built: the parser
        builds them to check their types, and its report of a failure would not be one line."""
        check_rise_limit(self.warning, "forgetting.warning")
        check_rise_limit(self.budget, "forgetting.budget")
        _check_count(self.check_interval, "forgetting.check_interval")
        _check_count(self.check_batches, "forgetting.check_batches")
        return self

    def plain(self) -> dict[str, Any]:
        """The options as plain values (hyperparameters, checkpoints)."""
        return asdict(self)


def as_forgetting(value: ForgettingOptions | Mapping[str, Any] | None) -> ForgettingOptions:
    """The options from what the data module was given: the options, their mapping (a config's
    ``forgetting:``, the hyperparameters of a checkpoint) or ``None`` (the defaults)."""
    if value is None:
        return ForgettingOptions()
    if isinstance(value, ForgettingOptions):
        return value.check()
    if not isinstance(value, Mapping):
        raise MLMAdaptError(f"forgetting={value!r} is not a mapping of {', '.join(_names())}")
    unknown = sorted(set(value) - set(_names()))
    if unknown:
        raise MLMAdaptError(f"forgetting.{unknown[0]} is no option; use {', '.join(_names())}")
    return ForgettingOptions(**value).check()


def _names() -> list[str]:
    return [f.name for f in fields(ForgettingOptions)]
