"""Before/after: validate the unadapted model at step 0 of ``fit`` and the final weights at its end.

A callback, so the Python API (``Trainer.fit``) gets the same as the CLI. Both passes are real validation
passes of the fit loop: their metrics reach every logger (``metrics.csv``, TensorBoard) at their step, the
checkpoint callbacks and the export see them like any other validation.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from typing_extensions import override

from mlm_adapt.model.metrics import before_after_metrics, metrics_table


def run_validation(trainer: L.Trainer) -> dict[str, float]:
    """Runs the fit loop's validation pass now (as ``val_check_interval`` would) and returns its metrics."""
    loop = trainer.fit_loop.epoch_loop
    # The same state switches as Lightning's own mid-epoch validation (TrainingEpochLoop.on_advance_end).
    trainer.validating = True
    first_loop_iter = trainer._logger_connector._first_loop_iter
    loop.val_loop.run()
    trainer.training = True
    trainer._logger_connector._first_loop_iter = first_loop_iter
    return before_after_metrics(trainer.callback_metrics)


class BeforeAfterValidation(L.Callback):
    """Validates the unadapted model when ``fit`` starts and the final weights when it ends.

    The step-0 metrics are the baseline: kept in the module (``baseline_metrics``, saved in every
    checkpoint) so a resumed run, the model card and ``export`` still have them. The final pass is skipped
    when the last validation already ran at the final step. Rank 0 prints the before/after table.
    """

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # Before the first optimizer step rather than in on_train_start: every callback has started by now
        # (ThroughputMonitor's validation hooks need their train-start state).
        if trainer.global_step > 0 or getattr(pl_module, "baseline_metrics", None):
            return  # resumed (or done): the baseline came with the checkpoint
        pl_module.baseline_metrics = run_validation(trainer)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if getattr(pl_module, "last_validated_step", -1) != trainer.global_step:
            run_validation(trainer)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        before = dict(getattr(pl_module, "baseline_metrics", None) or {})
        after = before_after_metrics(trainer.callback_metrics)
        if before and after and trainer.is_global_zero:
            print(metrics_table(before, after))
