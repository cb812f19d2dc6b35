"""Forgetting: ``ForgettingWarning`` says when adaptation costs too much on a non-primary validation set;
``ForgettingBudget`` moves the general-text replay rate so that it does not."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from mlm_adapt.data.replay import describe_replay
from mlm_adapt.data.samplers import KeyedDataset
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
                f"data.forgetting_warning={threshold}; replay general text (data.mix_files with "
                "data.mix_probability, or data.forgetting_budget) or lower the learning rate"
            )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"warned": list(self.warned)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.warned = list(state_dict.get("warned", []))


class ForgettingBudget(L.Callback):
    """Holds forgetting to ``data.forgetting_budget`` by moving the general-text mix rate during the run.

    Every ``data.forgetting_check_interval`` optimizer steps (and once before the first, the baseline) it
    measures the perplexity of the first ``data.forgetting_check_batches`` batches of the general validation
    set -- the second set of ``data.validation_files`` -- with their fixed validation masks, and hands it to
    the DataModule's :class:`~mlm_adapt.data.replay.Replay`, whose controller sets the rate of the next
    steps. Every rank evaluates the same batches and takes rank 0's value, so the rate is the same on all.
    The check runs before ModelCheckpoint (Lightning orders checkpoint callbacks last), so a checkpoint of
    step ``s`` holds the rate decided at ``s``; the state is the DataModule's, saved with it. Inactive
    unless the DataModule has a budget.
    """

    def _replay(self, trainer: L.Trainer) -> Any:
        replay = getattr(trainer.datamodule, "replay", None) if trainer.datamodule is not None else None
        return replay if replay is not None and replay.budget is not None else None

    def interval(self, trainer: L.Trainer) -> int:
        """Steps between checks: ``data.forgetting_check_interval``, else a twentieth of the run."""
        configured = trainer.datamodule.hparams.get("forgetting_check_interval")
        return configured or max(1, int(trainer.estimated_stepping_batches) // 20)

    def general_perplexity(self, trainer: L.Trainer, pl_module: L.LightningModule) -> float:
        """Perplexity of the check's batches: exp of the summed masked cross-entropy over masked tokens.

        No DataLoader (whose iterator would draw from the global random stream) and no dropout: the same
        number for the same weights, on every rank.
        """
        datamodule = trainer.datamodule
        name = datamodule.validation_set_names[1]
        dataset = KeyedDataset(datamodule.val_datasets[name])
        size = datamodule.hparams.eval_batch_size or datamodule.hparams.batch_size
        end = min(len(dataset), size * datamodule.hparams.forgetting_check_batches)
        modes = {module: module.training for module in pl_module.modules()}
        pl_module.eval()
        loss, count = torch.zeros((), dtype=torch.float64), 0
        try:
            with torch.no_grad(), trainer.precision_plugin.val_step_context():
                for start in range(0, end, size):
                    batch = datamodule.collator([dataset[i] for i in range(start, min(end, start + size))])
                    batch = {k: v.to(pl_module.device) for k, v in batch.items()}
                    logits, labels = pl_module.masked_logits(batch)
                    loss += F.cross_entropy(logits.float(), labels, reduction="sum").double().cpu()
                    count += labels.numel()
        finally:
            for module, training in modes.items():
                module.train(training)
        perplexity = math.exp(float(loss) / max(count, 1))
        return float(trainer.strategy.broadcast(perplexity, src=0))

    def _check(self, trainer: L.Trainer, pl_module: L.LightningModule, replay: Any) -> None:
        step = trainer.global_step
        perplexity = self.general_perplexity(trainer, pl_module)
        old, new = replay.update(step, perplexity)
        name = trainer.datamodule.validation_set_names[1]
        if len(replay.checks) == 1:
            rank_zero_info(
                f"mlm_adapt replay: step {step}: val_{name} check perplexity {perplexity:.4g} (the baseline "
                f"of data.forgetting_budget={replay.budget}); mix rate {new:g}"
            )
        elif new != old:
            rank_zero_info(
                f"mlm_adapt replay: step {step}: val_{name} check perplexity {perplexity:.4g}, "
                f"{replay.rise(perplexity):+.1%} over step 0 (budget +{replay.budget:.0%}): "
                f"mix rate {old:g} -> {new:g}"
            )

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        replay = self._replay(trainer)
        if replay is not None and replay.baseline is None and trainer.global_step == 0:
            self._check(trainer, pl_module, replay)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        replay = self._replay(trainer)
        step = trainer.global_step
        if replay is None or step == 0 or step % self.interval(trainer):
            return
        if replay.checks and replay.checks[-1].step >= step:
            return  # gradient accumulation: the step's other batches end here too
        self._check(trainer, pl_module, replay)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        replay = self._replay(trainer)
        if replay is None or not trainer.is_global_zero:
            return
        if summary := replay.summary():
            print(f"forgetting budget: {describe_replay(summary)}")
