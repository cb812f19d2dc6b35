"""Exporting: ``HFExport`` writes the adapted model as a Hugging Face directory after ``fit`` (optionally
pushes it), after checking before training that the monitored metric is logged and the fit trains a step;
:func:`export_checkpoint` writes the same directory and card from any checkpoint ``fit`` wrote
(``python -m mlm_adapt export``)."""

from __future__ import annotations

import copy
import difflib
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from mlm_adapt.data import MLMDataModule
from mlm_adapt.data.progress import Progress
from mlm_adapt.data.replay import summary_from_checkpoint
from mlm_adapt.downstream import DownstreamEvaluation
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.export.card import ExportInfo, checkpoint_name, val_metrics_at
from mlm_adapt.export.merge import (
    MergeReport,
    Scorer,
    base_weights,
    check_merge_run,
    checkpoint_merge_data,
    merge,
    merge_data,
    scoring_module,
)
from mlm_adapt.export.options import ExportOptions, check_hub_access
from mlm_adapt.export.writer import write_export
from mlm_adapt.guard.outputs import Output, check_output
from mlm_adapt.model.checkpoints import (
    callback_state,
    checkpoint_metadata,
    load_checkpoint,
    module_from_checkpoint,
    saved_checkpoints,
    tokenizer_for,
)
from mlm_adapt.model.metrics import EVAL_NAMES, SPREAD_SUFFIX, before_after_metrics, validation_prefix
from mlm_adapt.options import option_value
from mlm_adapt.text.tokenizer import load_tokenizer

# Inside the run root, next to the logs and checkpoints of the run (one root per run or Slurm job).
DEFAULT_DIRNAME = "export"
# Strategies whose module holds the whole model on every rank (others shard it: export reads checkpoints).
WHOLE_WEIGHTS = (SingleDeviceStrategy, DDPStrategy)

# Hyper-parameters naming files or directories the run reads: an output never is, contains, lies inside or
# would be globbed as one of them. (The datasets cache is not an input: an export inside it is harmless, and
# overwrite never replaces it, as it is no export.)
_MODEL_INPUTS = ("model_name_or_path", "new_tokens_file")
_DATA_INPUTS = (
    "train_files",
    "validation_files",
    "test_files",
    "replay.files",
    "segmentation.user_dict",
    "prepared_dir",
)

TASK_METRICS = {
    "sequence_classification": ("accuracy", "macro_f1"),
    "token_classification": ("f1", "accuracy"),
}
# Metric namespaces of mlm_adapt itself: a name in them that the run does not log is a mistake.
OWN_PREFIXES = ("train/", "val/", "val_", "test/", "downstream/")
# A name at least this similar (difflib ratio) to a logged one is taken for a typo of it.
TYPO_SIMILARITY = 0.85


def logged_metrics(validation_sets: Sequence[str], tasks: Iterable[tuple[str, str]]) -> list[str]:
    """Every metric name a fit logs that can pick the exported weights: the training loss, the metrics of
    every validation set (``MLMDataModule.validation_set_names``) and the scores, with their ``_std``, of
    every downstream task (``(name, type)`` in ``tasks``)."""
    names = ["train/loss"]
    for index in range(len(validation_sets)):
        prefix = validation_prefix(index, validation_sets)
        names += [f"{prefix}/{metric}" for metric in EVAL_NAMES]
    for task, kind in tasks:
        for metric in TASK_METRICS.get(kind, ()):
            names += [f"downstream/{task}/{metric}", f"downstream/{task}/{metric}{SPREAD_SUFFIX}"]
    return names


def check_monitor(monitor: str, logged: Sequence[str], key: str = "export.monitor") -> None:
    """Refuses a ``monitor`` in mlm_adapt's namespaces (:data:`OWN_PREFIXES`) that is not among the
    ``logged`` names, and any name within a typo of one (one line, closest match). Other names are the
    metrics of the user's own callbacks and pass."""
    if monitor in logged:
        return
    close = difflib.get_close_matches(monitor, logged, n=1, cutoff=TYPO_SIMILARITY)
    if not monitor.startswith(OWN_PREFIXES) and not close:
        return
    close = close or difflib.get_close_matches(monitor, logged, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    shown = ", ".join(name for name in logged if not name.endswith(SPREAD_SUFFIX))
    raise MLMAdaptError(f"{key}={monitor!r} is not a metric this run logs; {hint}it logs: {shown}")


def check_trains(trainer: L.Trainer, key: str = "export") -> None:
    """Refuses a fit that trains no step while it exports: the export would be the base model's weights
    under the name of an adapted model (to score the base model, run ``validate``)."""
    limits = {
        "trainer.max_steps": trainer.max_steps,
        "trainer.max_epochs": trainer.max_epochs,
        "trainer.limit_train_batches": trainer.limit_train_batches,
    }
    for name, value in limits.items():
        if value is not None and not isinstance(value, bool) and value == 0:
            raise MLMAdaptError(
                f"{name}={value} trains no step, so the {key} would be the base model's weights; "
                "set it above 0, or use `validate` to score the base model (or export.checkpoint=none)"
            )


def hparams_inputs(
    model_hparams: Any, data_hparams: Any, model_keys: tuple[str, ...] = _MODEL_INPUTS
) -> dict[str, list[str]]:
    """Files and directories a run reads according to its hyper-parameters, by config key (Hub names too:
    the output rules keep only what exists here)."""
    found: dict[str, list[str]] = {}
    sections = (("model", model_hparams, model_keys), ("data", data_hparams, _DATA_INPUTS))
    for section, hparams, keys in sections:
        for key in keys:
            value = option_value(hparams, key)
            # A file, a list of files, or named validation sets ({name: [files]}).
            groups = list(value.values()) if isinstance(value, dict) else [value]
            values = [v for g in groups for v in ([g] if isinstance(g, str) else list(g or []))]
            values = [v for v in values if isinstance(v, str) and v]
            if values:
                found[f"{section}.{key}"] = values
    return found


def _inputs(trainer: L.Trainer, pl_module: L.LightningModule, tasks: list[Any]) -> dict[str, list[str]]:
    """Local files and directories the run reads, by config key."""
    datamodule_hparams = trainer.datamodule.hparams if trainer.datamodule is not None else {}
    found = hparams_inputs(pl_module.hparams, datamodule_hparams)
    for i, task in enumerate(tasks):
        found[f"downstream.tasks[{i}].train_files"] = list(task.train_files)
        found[f"downstream.tasks[{i}].test_files"] = list(task.test_files)
    if trainer.ckpt_path:
        found["ckpt_path"] = [str(trainer.ckpt_path)]
    return found


def _run_dirs(trainer: L.Trainer) -> list[str]:
    """Where the run keeps checkpoints and logs: the root directory, each logger's and checkpoint's."""
    dirs = [trainer.default_root_dir]
    for logger in trainer.loggers:
        try:
            dirs.append(logger.log_dir)
        except (AttributeError, NotImplementedError, TypeError):  # loggers without a local directory
            continue
    dirs += [c.dirpath for c in trainer.checkpoint_callbacks if getattr(c, "dirpath", None)]
    return [d for d in dirs if d]


@dataclass(kw_only=True, eq=False)
class HFExport(ExportOptions, L.Callback):
    """Exports the adapted model at the end of ``fit`` as a Hugging Face directory (rank 0, after a barrier):
    safetensors weights, tokenizer, ``training_config.yaml`` and a ``README.md`` card with the before/after
    metrics, reloaded to check its logits. What the card needs is kept in every checkpoint too, so
    ``python -m mlm_adapt export`` can write the same card from any checkpoint later.

    Args:
        output_dir: Where to write; default ``<trainer.default_root_dir>/export``, in the run's root with
            its logs and checkpoints.
        checkpoint: The weights exported at the end of ``fit``. ``best``: those of the validation with the
            best ``monitor`` value: the best checkpoint of the ``ModelCheckpoint`` that monitors it or,
            without one, a copy of those weights kept in CPU memory during the run (the final weights if
            ``monitor`` was never logged); ``last``: the final weights; ``none``: no export (what the card
            needs is recorded in checkpoints either way).
        monitor: Any logged metric that picks the best weights, e.g. ``val/loss`` or
            ``downstream/sentiment/macro_f1`` (with ``mode: max``); the step-0 validation competes too.
        mode: ``min`` (losses, perplexity) or ``max`` (accuracy, F1): which ``monitor`` value is best.
    """

    option_prefix: ClassVar[str] = "export."

    output_dir: str | None = None
    checkpoint: Literal["best", "last", "none"] = "best"
    monitor: str = "val/loss"
    mode: Literal["min", "max"] = "min"

    def __post_init__(self) -> None:
        super().__post_init__()
        asked = "export.push_to_hub" if self.push_to_hub else "export.merge_*" if self.merges else None
        if self.checkpoint == "none" and asked:
            raise MLMAdaptError(
                f"{asked} needs an export, but export.checkpoint is none; set it to best or last"
            )
        # Recorded during fit and saved in checkpoints: the export command rebuilds the card from them.
        self.val_history: dict[int, dict[str, float]] = {}
        self.corpus_stats: dict[str, int] = {}
        self.config_yaml: str | None = None
        self.export_dir: Path | None = None
        self._output: Output | None = None
        # The best weights by ``monitor`` when no ModelCheckpoint keeps them: (value, step, CPU state dict).
        self._best: tuple[float, int, dict[str, torch.Tensor]] | None = None
        # Checkpoint files seen and steps pushed to a branch of their own (pushes_checkpoints).
        self._seen: set[tuple[str, int]] = set()
        self._pushed_steps: set[int | None] = set()

    def _monitoring(self, trainer: L.Trainer) -> list[ModelCheckpoint]:
        """The trainer's checkpoint callbacks that monitor ``monitor``."""
        return [c for c in trainer.checkpoint_callbacks if getattr(c, "monitor", None) == self.monitor]

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        config_callback = next((c for c in trainer.callbacks if isinstance(c, SaveConfigCallback)), None)
        if config_callback is not None:
            self.config_yaml = config_callback.parser.dump(config_callback.config, skip_none=False)
        self.corpus_stats = dict(getattr(trainer.datamodule, "corpus_stats", None) or {})
        if self.checkpoint == "none":
            return
        self.export_dir = self.resolved_output_dir(trainer)
        # Fail before training rather than after it.
        for callback in self._monitoring(trainer):
            if callback.mode != self.mode:
                raise MLMAdaptError(
                    f"export.mode={self.mode!r} but the ModelCheckpoint monitoring {self.monitor!r} has mode "
                    f"{callback.mode!r}; make them agree"
                )
        check_trains(trainer)
        if self.merges:
            check_merge_run(pl_module.hparams, trainer.datamodule, self.merge_budget)
        tasks = [t for c in trainer.callbacks if isinstance(c, DownstreamEvaluation) for t in c.tasks]
        if self.checkpoint == "best":
            sets = list(getattr(trainer.datamodule, "validation_set_names", None) or ["validation"])
            check_monitor(self.monitor, logged_metrics(sets, [(t.name, t.type) for t in tasks]))
        self._output = Output(
            self.export_dir,
            key="export.output_dir",
            overwrite=self.overwrite,
            inputs=_inputs(trainer, pl_module, tasks),
            run_dirs=_run_dirs(trainer),
        )
        if self.pushes_checkpoints and not trainer.checkpoint_callbacks:
            raise MLMAdaptError(
                f"export.revision={self.revision!r} pushes each checkpoint the fit saves, but it saves none; "
                "add a ModelCheckpoint to trainer.callbacks (every_n_train_steps: how often) or drop {step}"
            )
        if trainer.is_global_zero:
            check_output(self._output)
            if self.push_to_hub:
                check_hub_access(self.repo_id, key="export.repo_id")

    def resolved_output_dir(self, trainer: L.Trainer) -> Path:
        """Where the export goes: ``output_dir``, else ``export`` in the run root (``default_root_dir``)."""
        return Path(self.output_dir or Path(trainer.default_root_dir) / DEFAULT_DIRNAME)

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        metrics = before_after_metrics(trainer.callback_metrics)  # every validation set and task
        if metrics:
            self.val_history[trainer.global_step] = metrics
        # The callback keeps the best weights itself when no ModelCheckpoint monitors ``monitor``.
        keeps_best = (
            self.checkpoint == "best"
            and trainer.is_global_zero
            and isinstance(trainer.strategy, WHOLE_WEIGHTS)
            and not self._monitoring(trainer)
        )
        if keeps_best and self.monitor in trainer.callback_metrics:
            value = float(trainer.callback_metrics[self.monitor])
            best = self._best[0] if self._best else None
            if best is None or (value < best if self.mode == "min" else value > best):
                # Only rank 0 exports; a CPU copy, so the GPU holds one model either way.
                state = {k: v.detach().to("cpu", copy=True) for k, v in pl_module.model.state_dict().items()}
                self._best = (value, trainer.global_step, state)

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        # A ModelCheckpoint runs after this callback: what it saved at a step is pushed a batch later.
        self._push_checkpoints(trainer)

    def _push_checkpoints(self, trainer: L.Trainer) -> None:
        """With ``pushes_checkpoints``: on rank 0, exports each checkpoint file the ModelCheckpoints saved
        since the last call and pushes it to its step's branch (a file per step: ``last.ckpt`` repeats one).
        A failed push is one warning: training goes on, the checkpoint stays, ``export`` pushes it later."""
        if not (self.pushes_checkpoints and trainer.is_global_zero and self._output is not None):
            return
        # A file by its modification time too: a ModelCheckpoint that keeps only last.ckpt rewrites it.
        saved = {
            (p, Path(p).stat().st_mtime_ns)
            for c in trainer.checkpoint_callbacks
            for p in saved_checkpoints(c)
        }
        new, self._seen = saved - self._seen, self._seen | saved
        found: dict[int | None, str] = {}
        # last.ckpt repeats the step of a file of its own: that file names the step's checkpoint.
        for path in sorted((p for p, _ in new), key=lambda p: Path(p).name.startswith("last")):
            found.setdefault(checkpoint_metadata(path, key="export.revision").get("global_step"), path)
        for step, path in sorted(found.items(), key=lambda item: item[0] or 0):
            if step in self._pushed_steps:
                continue
            self._pushed_steps.add(step)
            branch = self.branch(step)
            options = ExportOptions(
                license=self.license, tags=self.tags, push_to_hub=True, repo_id=self.repo_id,
                private=self.private, revision=branch,
            )  # fmt: skip
            later = (
                f"training goes on, {path} is kept: `python -m mlm_adapt export --ckpt_path {path} "
                f"--output_dir DIR --push_to_hub --repo_id {self.repo_id} --revision {branch}` pushes it"
            )
            progress = Progress("export", bars=trainer.progress_bar_callback is not None)
            # The export is made for the push: it lives as long as the upload, in the run's root.
            Path(trainer.default_root_dir).mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=".mlm_adapt-push-", dir=trainer.default_root_dir) as tmp:
                try:
                    result = export_checkpoint(
                        path, str(Path(tmp) / "export"), options, progress=progress, kept=later
                    )
                except MLMAdaptError as exc:
                    rank_zero_warn(f"mlm_adapt export: {exc}")
                    continue
            rank_zero_info(f"mlm_adapt export: pushed {checkpoint_name(path, step)} to {result.hub_url}")

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "val_history": self.val_history,
            "corpus_stats": self.corpus_stats,
            "config_yaml": self.config_yaml,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Resuming keeps the earlier validation history (the card's "after" may come from before the resume).
        self.val_history = {int(k): dict(v) for k, v in state_dict.get("val_history", {}).items()}

    def _why_no_best(self, trainer: L.Trainer) -> str:
        """Why a validated run has no best weights: no saved checkpoint yet, or the metric never logged."""
        logged = any(self.monitor in metrics for metrics in self.val_history.values())
        if self._monitoring(trainer) and (logged or self.monitor in trainer.callback_metrics):
            return (
                f"no ModelCheckpoint monitoring {self.monitor!r} saved a checkpoint during the run (its "
                "every_n_train_steps or every_n_epochs was not reached)"
            )
        return f"{self.monitor!r} was never logged"

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.export_dir is None or self._output is None:
            return
        trainer.strategy.barrier("mlm_adapt_export")
        if not trainer.is_global_zero:
            return
        self._push_checkpoints(trainer)
        path = None
        if self.checkpoint == "best":
            path = next((c.best_model_path for c in self._monitoring(trainer) if c.best_model_path), None)
        what = f"best checkpoint by {self.monitor}"
        # Under FSDP/DeepSpeed the in-memory weights are sharded across ranks: export from checkpoint files.
        if path is None and not isinstance(trainer.strategy, WHOLE_WEIGHTS):
            path = next((c.last_model_path for c in trainer.checkpoint_callbacks if c.last_model_path), None)
            if path is None:
                raise MLMAdaptError(
                    f"export: the {type(trainer.strategy).__name__} weights are sharded, so export reads a "
                    f"checkpoint: add a ModelCheckpoint monitoring {self.monitor!r} or with save_last: true"
                )
            what = "last checkpoint"
        baseline = dict(getattr(pl_module, "baseline_metrics", {}))
        if path is not None:
            checkpoint = load_checkpoint(path, key="export.checkpoint")
            module = module_from_checkpoint(checkpoint, key="export.checkpoint")
            model, step, epoch = module.model, checkpoint.get("global_step"), checkpoint.get("epoch")
            baseline = module.baseline_metrics or baseline
            source = f"{what}: {checkpoint_name(path, step)}"
        elif self._best is not None:
            value, step, state = self._best
            model, epoch = copy.deepcopy(pl_module.model), None
            model.load_state_dict(state)
            source = f"best weights by {self.monitor} ({self.mode}, {value:.4f}) at step {step}"
        else:
            model, step, epoch = pl_module.model, trainer.global_step, trainer.current_epoch
            source = "final weights of the run"
            if self.checkpoint == "best" and self.val_history:  # validated, yet no best weights
                rank_zero_warn(f"export.monitor: {self._why_no_best(trainer)}; exported the final weights")
        final, final_step = val_metrics_at(self.val_history, step)
        # With a branch per checkpoint, the weights fit ends with go to main (what from_pretrained loads).
        branch = None if self.pushes_checkpoints else self.branch(step)
        progress = Progress("export", bars=trainer.progress_bar_callback is not None)
        report = None
        if self.merges:
            model, report = self._merge(trainer, pl_module, model, progress)
            # The before/after table's third column (training.callbacks.BeforeAfterValidation).
            pl_module.merged_column = (report.merged_metrics, f"merged α={report.alpha:.4g}")
        datamodule = trainer.datamodule
        tokenizer = getattr(datamodule, "tokenizer", None) or load_tokenizer(
            pl_module.hparams["model_name_or_path"], pl_module.hparams.get("new_tokens_file")
        )
        replay = getattr(datamodule, "replay_report", None)  # what replay under a forgetting budget did
        info = ExportInfo(
            head=getattr(pl_module, "head", None),
            model_hparams=dict(pl_module.hparams),
            data_hparams=dict(getattr(datamodule, "hparams", {}) or {}),
            baseline_metrics=baseline,
            final_metrics=final,
            final_metrics_step=final_step,
            corpus_stats=self.corpus_stats,
            config_yaml=self.config_yaml,
            source=source,
            global_step=step,
            epoch=epoch,
            **self.card_fields(branch),
            replay=replay(step) if replay is not None else {},
            merge=report.plain() if report is not None else {},
        )
        diff = write_export(model, tokenizer, self._output, info, progress=progress)
        check = f"; reload check: max |logit difference| {diff:.2e}"
        after = f"; val/loss {final['val/loss']:.4f} at step {final_step}" if "val/loss" in final else ""
        merged = f", merged toward the base at α={report.alpha:.4g}" if report is not None else ""
        rank_zero_info(f"mlm_adapt export: wrote {self.export_dir} ({source}{merged}){after}{check}")
        url = self.push(self.export_dir, progress, branch)
        if url is not None:
            rank_zero_info(f"mlm_adapt export: pushed to {url}")

    def _merge(
        self, trainer: L.Trainer, pl_module: L.LightningModule, model: Any, progress: Progress
    ) -> tuple[Any, MergeReport]:
        """``model``'s weights merged toward the run's base (``merge_alpha``, or chosen under
        ``merge_budget`` on the validation blocks the run scored), in a module of its own; and the report."""
        key = "export.merge_budget" if self.merge_budget is not None else "export.merge_alpha"
        hparams = dict(pl_module.hparams)
        with progress.phase("merging toward the base model"):
            base = base_weights(hparams, key)
            module = scoring_module(hparams, model.state_dict(), getattr(pl_module, "new_tokens", []), key)
            scorer = Scorer(module, trainer.strategy.root_device, trainer.precision_plugin.val_step_context)
            data = merge_data(trainer.datamodule, list(trainer.num_val_batches or []))
            report = merge(scorer, base, data, self.merge_alpha, self.merge_budget)
        rank_zero_info(f"mlm_adapt merge: {report.describe()}")
        rank_zero_info(report.table())
        return module.model, report


@dataclass
class ExportResult:
    """What :func:`export_checkpoint` did."""

    info: ExportInfo
    logit_difference: float
    hub_url: str | None
    merge: MergeReport | None = None


def export_checkpoint(
    ckpt_path: str,
    output_dir: str,
    options: ExportOptions,
    base_model: str | None = None,
    progress: Progress | None = None,
    datamodule: MLMDataModule | None = None,
    limit_val_batches: int | float | None = None,
    kept: str | None = None,
) -> ExportResult:
    """Writes the checkpoint file or FSDP sharded directory ``ckpt_path`` as a Hugging Face directory (and
    optionally pushes it to the Hub), with ``base_model`` if the one it records is not here. The card's
    metrics, corpus statistics and config come from what the run stored in the checkpoint (the module's
    baseline, ``HFExport``'s state). A merge (``options.merge_*``) is scored on the validation sets of
    ``datamodule`` (built from the user's config, never from the checkpoint), ``limit_val_batches`` of each,
    if one is given; ``merge_budget`` needs it. ``kept`` ends the line of a failed push (default: where the
    local export is kept)."""
    progress = progress or Progress("export")
    # The checkpoint, a local base model and what the run read (as the checkpoint records it: the model it
    # started from above all) must survive the export, whatever overwrite says. The metadata is read
    # without the weights, so a refused output costs nothing.
    saved = checkpoint_metadata(ckpt_path, key="--ckpt_path")
    recorded = hparams_inputs(saved.get("hyper_parameters"), saved.get("datamodule_hyper_parameters"))
    inputs = {
        "--ckpt_path": [ckpt_path],
        "--base_model": [base_model] if base_model else [],
        **{f"{key} in the checkpoint": paths for key, paths in recorded.items()},
    }
    output = Output(output_dir, key="--output_dir", overwrite=options.overwrite, inputs=inputs)
    check_output(output)
    if options.push_to_hub:
        check_hub_access(options.repo_id)
    if options.merge_budget is not None and datamodule is None:
        raise MLMAdaptError(
            "--merge_budget chooses alpha on the run's validation sets: give the run's fit config as "
            "--data_config (or --merge_alpha, e.g. the alpha a budgeted export's card reports)"
        )
    with progress.phase(f"loading {ckpt_path}"):
        checkpoint = load_checkpoint(ckpt_path)
        module = module_from_checkpoint(checkpoint, base_model)
    tokenizer = tokenizer_for(checkpoint, base_model)
    report = None
    if options.merges:
        key = "--merge_budget" if options.merge_budget is not None else "--merge_alpha"
        hparams = dict(checkpoint.get("hyper_parameters") or {})
        data = None
        if datamodule is not None:
            with progress.phase("loading the validation sets of --data_config"):
                data = checkpoint_merge_data(datamodule, tokenizer, limit_val_batches)
        with progress.phase("merging toward the base model"):
            base = base_weights(hparams, key, base_model)
            device = "cuda" if torch.cuda.is_available() else "cpu"
            scorer = Scorer(module, device)
            report = merge(scorer, base, data, options.merge_alpha, options.merge_budget)
    state = callback_state(checkpoint, HFExport.__qualname__)
    history = {int(k): v for k, v in (state.get("val_history") or {}).items()}
    final, final_step = val_metrics_at(history, checkpoint.get("global_step"))
    branch = options.branch(checkpoint.get("global_step"))
    info = ExportInfo(
        head=module.head,
        model_hparams=dict(checkpoint.get("hyper_parameters") or {}),
        data_hparams=dict(checkpoint.get("datamodule_hyper_parameters") or {}),
        baseline_metrics=module.baseline_metrics,
        final_metrics=final,
        final_metrics_step=final_step,
        corpus_stats=dict(state.get("corpus_stats") or {}),
        config_yaml=state.get("config_yaml"),
        source=f"checkpoint {checkpoint_name(ckpt_path, checkpoint.get('global_step'))}",
        global_step=checkpoint.get("global_step"),
        epoch=checkpoint.get("epoch"),
        **options.card_fields(branch),
        replay=summary_from_checkpoint(checkpoint.get(MLMDataModule.__qualname__)),
        merge=report.plain() if report is not None else {},
    )
    diff = write_export(module.model, tokenizer, output, info, progress=progress)
    return ExportResult(info, diff, options.push(Path(output_dir), progress, branch, kept), report)
