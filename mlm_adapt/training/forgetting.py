"""``ForgettingWarning``: says when adaptation costs too much on a non-primary validation set."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from mlm_adapt.errors import MLMAdaptError

# ``val_<name>/perplexity``: a non-primary validation set (the primary one logs ``val/*``).
_OTHER_SET = re.compile(r"^(val_[^/]+)/perplexity$")


def forgotten_sets(
    baseline: Mapping[str, float], current: Mapping[str, Any], threshold: float
) -> list[tuple[str, float, float]]:
    """Non-primary validation sets whose perplexity rose by more than ``threshold`` over step 0.

    Args:
        baseline: The step-0 metrics (``val_<name>/perplexity`` among them).
        current: The latest validation metrics (floats or scalar tensors).
        threshold: Allowed relative rise, e.g. ``0.2`` for +20%.

    Returns:
        ``(prefix, before, after)`` per set, e.g. ``("val_general", 50.0, 61.0)``, in ``current``'s order.
    """
    rising = []
    for name, value in current.items():
        match = _OTHER_SET.match(name)
        if match and name in baseline:
            before, after = float(baseline[name]), float(value)
            if after > before * (1 + threshold):
                rising.append((match.group(1), before, after))
    return rising


class ForgettingWarning(L.Callback):
    """Warns once per validation set when its perplexity rises by more than a fraction of its step-0 value.

    The first validation set (``val/*``) is the domain being adapted to; the others (``val_<name>/*``,
    from ``data.validation_files`` as a mapping) measure what the model forgets. The step-0 values are the
    module's ``baseline_metrics``, kept in checkpoints; the sets already warned about are too.

    Args:
        threshold: Allowed relative rise (``0.2``: warn above +20%); ``None`` takes
            ``data.forgetting_warning`` of the datamodule, and no warning is given when that is unset too.
    """

    def __init__(self, threshold: float | None = None):
        if threshold is not None and threshold <= 0:
            raise MLMAdaptError(
                f"data.forgetting_warning={threshold} must be > 0, e.g. 0.2 (+20% perplexity)"
            )
        self.threshold = threshold
        self.warned: list[str] = []

    def _threshold(self, trainer: L.Trainer) -> float | None:
        if self.threshold is not None:
            return self.threshold
        hparams = getattr(getattr(trainer, "datamodule", None), "hparams", None) or {}
        return hparams.get("forgetting_warning")

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        threshold = self._threshold(trainer)
        if trainer.sanity_checking or threshold is None or trainer.state.fn != "fit":
            return
        baseline = getattr(pl_module, "baseline_metrics", None) or {}
        for prefix, before, after in forgotten_sets(baseline, trainer.callback_metrics, threshold):
            if prefix in self.warned:
                continue
            self.warned.append(prefix)
            rank_zero_warn(
                f"forgetting: {prefix}/perplexity rose {after / before - 1:.0%} over its step-0 value "
                f"({before:.4g} -> {after:.4g}) at step {trainer.global_step}, more than "
                f"data.forgetting_warning={threshold}; mix general text in (data.mix_files, "
                "data.mix_probability) or lower the learning rate"
            )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"warned": list(self.warned)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.warned = list(state_dict.get("warned", []))
