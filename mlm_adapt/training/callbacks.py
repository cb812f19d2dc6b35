"""Training callbacks: the ones the CLI always adds (:func:`default_callbacks`). Among them: the
before/after validation, the scale summary, ``ForgettingWarning`` (when adaptation costs too much on a
non-primary validation set) and ``ForgettingBudget`` (which moves the general-text replay rate so that it
does not)."""

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

from mlm_adapt.data.forgetting import ForgettingOptions
from mlm_adapt.data.replay import describe_replay
from mlm_adapt.data.samplers import KeyedDataset
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.model.metrics import before_after_metrics, metrics_table
from mlm_adapt.training.exact_resume import ExactResume
from mlm_adapt.training.resume import ResumeMatch
from mlm_adapt.training.signals import StopOnSignal


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


def baseline_step(pl_module: L.LightningModule) -> int:
    """The step the before column is scored at: 0, or after ``model.head_warmup_steps``."""
    return int((getattr(pl_module, "hparams", None) or {}).get("head_warmup_steps", 0))


class BeforeAfterValidation(L.Callback):
    """Validates the unadapted model when ``fit`` starts (after the head warm-up, if any) and the final
    weights when it ends (unless the last validation ran at the final step); rank 0 prints the before/after
    table.

    Both are real validation passes of the fit loop, seen by every logger, checkpoint callback and the
    export. The baseline metrics are kept in the module (``baseline_metrics``, saved in every checkpoint).
    """

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        warmup = baseline_step(pl_module)
        if warmup and 0 < trainer.max_steps <= warmup:
            raise MLMAdaptError(
                f"model.head_warmup_steps={warmup} leaves no step to train the whole model in "
                f"trainer.max_steps={trainer.max_steps}; set it below max_steps"
            )

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # Before the first optimizer step rather than in on_train_start: every callback has started by now
        # (ThroughputMonitor's validation hooks need their train-start state).
        if trainer.global_step != baseline_step(pl_module) or getattr(pl_module, "baseline_metrics", None):
            return  # in the head warm-up, resumed or done: the baseline is later or in the checkpoint
        pl_module.baseline_metrics = run_validation(trainer)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if getattr(pl_module, "last_validated_step", -1) != trainer.global_step:
            run_validation(trainer)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        before = dict(getattr(pl_module, "baseline_metrics", None) or {})
        after = before_after_metrics(trainer.callback_metrics)
        # (metrics, heading): set by the export when it merged the weights toward the base (export.merge_*).
        merged = getattr(pl_module, "merged_column", None) or ()
        if before and after and trainer.is_global_zero:
            print(metrics_table(before, after, *merged))
            if warmup := baseline_step(pl_module):
                print(f"before: step {warmup}, after model.head_warmup_steps={warmup} trained the head alone")


class GlobalBatchInfo(L.Callback):
    """Logs the global batch (``data.batch_size x accumulate_grad_batches x world size``) and tokens per
    optimizer step (x ``max_seq_length``: exact with packing, an upper bound without) when training
    starts, to the console (rank 0) and to every logger as metrics at step 0."""

    def __init__(self):
        self.info: dict[str, int] = {}

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        hparams = getattr(trainer.datamodule, "hparams", {})
        batch_size = int(hparams.get("batch_size", 0))
        max_seq_length = int(hparams.get("max_seq_length", 0))
        global_batch = batch_size * trainer.accumulate_grad_batches * trainer.world_size
        self.info = {
            "world_size": trainer.world_size,
            "num_nodes": trainer.num_nodes,
            "per_device_batch_size": batch_size,
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "global_batch_size": global_batch,
            "tokens_per_step": global_batch * max_seq_length,
        }
        rank_zero_info(
            f"mlm_adapt scale: {trainer.world_size} process(es) on {trainer.num_nodes} node(s) "
            f"({type(trainer.strategy).__name__}); global batch {global_batch} = {batch_size} per device x "
            f"{trainer.accumulate_grad_batches} accumulation x {trainer.world_size}; "
            f"tokens per step {global_batch * max_seq_length:,}"
        )
        for logger in trainer.loggers:
            logger.log_metrics(
                {f"scale/{k}": float(v) for k, v in self.info.items()}, step=trainer.global_step
            )


# ``val_<name>/perplexity``: a non-primary validation set (the primary one logs ``val/*``).
_OTHER_SET = re.compile(r"^(val_[^/]+)/perplexity$")


def forgotten_sets(
    baseline: Mapping[str, float], current: Mapping[str, Any], threshold: float
) -> list[tuple[str, float, float]]:
    """Non-primary validation sets whose perplexity in ``current`` (floats or scalar tensors) rose by more
    than ``threshold`` (``0.2``: +20%) over the step-0 ``baseline``, as ``(prefix, before, after)``, e.g.
    ``("val_general", 50.0, 61.0)``, in ``current``'s order."""
    rising = []
    for name, value in current.items():
        match = _OTHER_SET.match(name)
        if match and name in baseline:
            before, after = float(baseline[name]), float(value)
            if after > before * (1 + threshold):
                rising.append((match.group(1), before, after))
    return rising


def forgetting_options(trainer: L.Trainer) -> ForgettingOptions:
    """The ``forgetting.*`` options of the trainer's data module (the defaults, none set, without one: a
    data module of the user's own)."""
    options = getattr(getattr(trainer, "datamodule", None), "forgetting", None)
    return options if isinstance(options, ForgettingOptions) else ForgettingOptions()


class ForgettingWarning(L.Callback):
    """Warns once per validation set when its perplexity rises by more than a fraction of its step-0 value.

    The first validation set (``val/*``) is the domain being adapted to; the others (``val_<name>/*``)
    measure what the model forgets. The step-0 values are the module's ``baseline_metrics``.

    Args:
        threshold: Allowed relative rise (``0.2``: warn above +20%); ``None`` takes
            ``forgetting.warning`` of the datamodule, and no warning is given when that is unset too.
    """

    def __init__(self, threshold: float | None = None):
        self.threshold = ForgettingOptions(warning=threshold).check().warning  # as forgetting.warning is
        self.warned: list[str] = []

    def _threshold(self, trainer: L.Trainer) -> float | None:
        if self.threshold is not None:
            return self.threshold
        return forgetting_options(trainer).warning

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
                f"forgetting.warning={threshold}; replay general text (data.replay.files with "
                "data.replay.rate, or forgetting.budget) or lower the learning rate"
            )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"warned": list(self.warned)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.warned = list(state_dict.get("warned", []))


class ForgettingBudget(L.Callback):
    """Holds forgetting to ``forgetting.budget`` by moving the general-text replay rate during the run.

    Every ``forgetting.check_interval`` optimizer steps (and before the first) the perplexity of the
    first ``forgetting.check_batches`` batches of the general validation set goes to the DataModule's
    :class:`~mlm_adapt.data.replay.Replay`, which sets the rate of the next steps. It runs before
    ModelCheckpoint (Lightning orders checkpoint callbacks last), so a checkpoint of step ``s`` holds the
    rate decided at ``s``. Inactive unless the DataModule has a budget.
    """

    def _replay(self, trainer: L.Trainer) -> Any:
        replay = getattr(trainer.datamodule, "replayer", None)
        return replay if replay is not None and replay.budget is not None else None

    def interval(self, trainer: L.Trainer) -> int:
        """Steps between checks: ``forgetting.check_interval``, else a twentieth of the run."""
        configured = forgetting_options(trainer).check_interval
        return configured or max(1, int(trainer.estimated_stepping_batches) // 20)

    def general_perplexity(self, trainer: L.Trainer, pl_module: L.LightningModule) -> float:
        """Perplexity of the check's batches (fixed validation masks), rank 0's value. No DataLoader (its
        iterator would draw from the global random stream) and no dropout: the same for the same weights."""
        datamodule = trainer.datamodule
        name = datamodule.validation_set_names[1]
        dataset = KeyedDataset(datamodule.val_datasets[name])
        size = datamodule.eval_batch_size
        end = min(len(dataset), size * forgetting_options(trainer).check_batches)
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
        base = replay.baseline_step
        if len(replay.checks) == 1:
            since = "" if step == 0 else ", set on resume: rises are measured from this step"
            rank_zero_info(
                f"mlm_adapt replay: step {step}: val_{name} check perplexity {perplexity:.4g} (the baseline "
                f"of forgetting.budget={replay.budget}{since}); replay rate {new:g}"
            )
        elif new != old:
            rank_zero_info(
                f"mlm_adapt replay: step {step}: val_{name} check perplexity {perplexity:.4g}, "
                f"{replay.rise(perplexity):+.1%} over step {base} (budget +{replay.budget:.0%}): "
                f"replay rate {old:g} -> {new:g}"
            )

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        replay = self._replay(trainer)
        total = trainer.estimated_stepping_batches
        if replay is None or not math.isfinite(total):
            return
        interval, step = self.interval(trainer), trainer.global_step
        first = (step // interval + 1) * interval  # the first check after the baseline or the checkpoint
        if first > total:
            since = "after step 0" if step == 0 else f"after the resumed step {step}"
            rank_zero_warn(
                f"forgetting.check_interval={interval} leaves no forgetting check {since} in a run of "
                f"{int(total)} optimizer steps (the first would be at step {first}): forgetting is not "
                "measured, and the end of the run and the model card say so instead of a verdict; set "
                f"forgetting.check_interval below {int(total) - step} (unset: a twentieth of the run)"
            )

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # The baseline: before step 0 (after the head warm-up), or before the first resumed step when the
        # budget came on resume.
        replay = self._replay(trainer)
        if replay is not None and replay.baseline is None and trainer.global_step >= baseline_step(pl_module):
            self._check(trainer, pl_module, replay)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        replay = self._replay(trainer)
        step = trainer.global_step
        if replay is None or step <= baseline_step(pl_module) or step % self.interval(trainer):
            return
        if replay.checks and replay.checks[-1].step >= step:
            return  # gradient accumulation: the step's other batches end here too
        self._check(trainer, pl_module, replay)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Whatever the last segment's budget: the checks of a budget dropped on resume are reported too.
        report = getattr(trainer.datamodule, "replay_report", None)
        summary = report() if report is not None else {}
        if "budget" in summary and trainer.is_global_zero:
            print(f"forgetting budget: {describe_replay(summary)}")


def default_callbacks() -> list[L.Callback]:
    """Callbacks the CLI always adds (persistent ``trainer_defaults``); the forgetting ones act only when
    ``forgetting.warning``/``forgetting.budget`` are set.

    ``ResumeMatch`` comes first: a refused resume stops before any other callback's ``setup`` writes.
    ``BeforeAfterValidation`` comes before ``ExactResume``: its step-0 validation runs in the first
    ``on_train_batch_start``, and ExactResume's reseeding after it keeps dropout independent of it.
    """
    return [
        ResumeMatch(),
        BeforeAfterValidation(),
        ExactResume(),
        GlobalBatchInfo(),
        ForgettingWarning(),
        ForgettingBudget(),
        StopOnSignal(),
    ]
