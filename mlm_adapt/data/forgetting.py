"""The ``forgetting:`` options (``--forgetting.*``): the warning on a general set's rise, and the budget with
its checks. The data module holds them (its replay moves the mix rate under the budget) and the training
callbacks read them from there, typed; they are checked here, once.

Before they were a group they were data module options (``data.forgetting_budget``, ...): such a key is
refused with the one that replaced it (:func:`renamed_key_line`), and a checkpoint's data hyperparameters
are read in either form (:func:`forgetting_of`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from mlm_adapt.errors import MLMAdaptError

# ``data.<old key>`` -> the field of ForgettingOptions that replaced it (``forgetting.<field>``).
RENAMED_KEYS = {
    "forgetting_warning": "warning",
    "forgetting_budget": "budget",
    "forgetting_check_interval": "check_interval",
    "forgetting_check_batches": "check_batches",
}
# How jsonargparse names a key it does not know: on the command line (``unrecognized arguments: ...``),
# in a config (``Subcommand 'fit' does not accept option 'data.KEY'``) and in a ``--data`` mapping
# (``Group 'data' does not accept option 'KEY'``).
_UNKNOWN_KEY = re.compile(
    r"unrecognized arguments:.*?--data\.(forgetting_\w+)"
    r"|does not accept option '(?:[\w.]*\.)?data\.(forgetting_\w+)'"
    r"|Group '(?:[\w.]*\.)?data' does not accept option '(forgetting_\w+)'",
    re.DOTALL,
)


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
            ``data.mix_files`` and a general validation set (the second of ``data.validation_files`` as a
            mapping).
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


def forgetting_of(data_hparams: Mapping[str, Any]) -> ForgettingOptions:
    """The options of a data module's hyperparameters, as a checkpoint holds them: ``forgetting`` (this
    version), or the flat ``forgetting_*`` keys of checkpoints written before the group existed."""
    if data_hparams.get("forgetting") is not None:
        return as_forgetting(data_hparams["forgetting"])
    old = {new: data_hparams[key] for key, new in RENAMED_KEYS.items() if data_hparams.get(key) is not None}
    return as_forgetting(old)


def renamed_key_line(message: str) -> str | None:
    """One line for a parser error about an old ``data.forgetting_*`` key (command line or config), naming
    the key that replaced it; ``None`` for any other error."""
    for found in _UNKNOWN_KEY.finditer(message):
        old = next(name for name in found.groups() if name)
        if old in RENAMED_KEYS:
            return f"data.{old} is now forgetting.{RENAMED_KEYS[old]}"
    return None


def _names() -> list[str]:
    return [f.name for f in fields(ForgettingOptions)]
