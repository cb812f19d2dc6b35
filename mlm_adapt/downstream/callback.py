"""``DownstreamEvaluation``: task scores of the weights being adapted, at step 0 and at every validation."""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from transformers import PreTrainedTokenizerBase
from typing_extensions import override

from mlm_adapt.data.progress import SILENT, Progress
from mlm_adapt.downstream.evaluate import Method, TaskEvaluator
from mlm_adapt.downstream.features import ForwardContext, Pooling
from mlm_adapt.downstream.tasks import load_task, parse_task
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.model.loading import position_limit
from mlm_adapt.text.files import expand_files
from mlm_adapt.text.tokenizer import load_tokenizer

PREFIX = "downstream"


class DownstreamEvaluation(L.Callback):
    """Scores labelled tasks with the current weights at step 0 (the unadapted model) and at the end of
    every validation, logged as ``downstream/<task>/<metric>`` and ``downstream/<task>/<metric>_std``, plus
    ``downstream/time_s``. Every rank computes the same and logs rank 0's result; the adapted model, its
    mode and the random-number state are left as they were. Methods, types and costs: docs/downstream.md.

    Args:
        tasks: Labelled tasks: mappings with ``name``, ``train_files``, ``test_files`` and optionally
            ``type`` and column keys (:class:`~mlm_adapt.downstream.types.base.DownstreamTask`).
        method: ``linear_probe`` or ``finetune``.
        seeds: Fine-tuning runs per evaluation (``finetune`` only).
        layers: Hidden states the probe reads, concatenated (0: embeddings, -1: the encoder's output).
        pooling: Probe features of a text: ``mean`` of its non-special tokens, ``first`` or ``mean_first``.
        max_train_examples: At most this many training examples per task (a seeded subset; default: all).
        max_test_examples: Score at most this many test examples per task (seeded subset; default: all).
        every_n_validations: Score at step 0, then at every n-th validation of ``fit`` and at its end
            (the probe; ``finetune`` scores at step 0 and at the end only).
        finetune_steps: Optimizer steps of each fine-tune.
        finetune_lr: AdamW learning rate of each fine-tune (linear decay, 10% warmup).
        finetune_batch_size: Examples per fine-tuning step.

    The task files are cached where the data module caches (``data.cache_dir``), a row holds at most the
    model's ``max_seq_length`` tokens (at most 512), and rows are forwarded ``data.eval_batch_size`` at a
    time. The probe's L2 weight and its bootstrap resamples are :meth:`TaskEvaluator.linear_probe`'s.
    """

    def __init__(
        self,
        tasks: list[dict[str, Any]] | None = None,
        method: Method = "linear_probe",
        seeds: int = 3,
        layers: list[int] | None = None,
        pooling: Pooling = "mean",
        max_train_examples: int | None = None,
        max_test_examples: int | None = None,
        every_n_validations: int = 1,
        finetune_steps: int = 200,
        finetune_lr: float = 5e-5,
        finetune_batch_size: int = 16,
    ):
        if method not in ("linear_probe", "finetune"):
            raise MLMAdaptError(f"downstream.method={method!r}; use linear_probe or finetune")
        if seeds < 1:
            raise MLMAdaptError(f"downstream.seeds={seeds} must be at least 1")
        for key, value in (
            ("every_n_validations", every_n_validations),
            ("max_train_examples", max_train_examples),
            ("max_test_examples", max_test_examples),
        ):
            if value is not None and value < 1:
                raise MLMAdaptError(f"downstream.{key}={value} must be at least 1")
        self.tasks = [parse_task(entry, i) for i, entry in enumerate(tasks or [])]
        for i, entry in enumerate(self.tasks):  # missing files fail now, not after the corpus is prepared
            expand_files(entry.train_files, f"downstream.tasks[{i}].train_files")
            expand_files(entry.test_files, f"downstream.tasks[{i}].test_files")
        self.method = method
        self.limits = (max_train_examples, max_test_examples)
        self.every_n_validations = every_n_validations
        # The options of TaskEvaluator.linear_probe and TaskEvaluator.finetune.
        # The rest of TaskEvaluator.linear_probe's options (the forward batch) comes with the data module.
        self.probe_options = {"layers": list(layers) if layers else [-1], "pooling": pooling}
        self.finetune_options = {"seeds": seeds, "steps": finetune_steps, "lr": finetune_lr}
        self.finetune_options["batch_size"] = finetune_batch_size
        self.evaluators: list[TaskEvaluator] = []
        self.results: dict[int, dict[str, float]] = {}  # global step -> logged metrics
        self.outside_validation: set[int] = set()  # steps scored outside a validation pass
        self.validations = 0  # validations of fit after step 0 (every_n_validations counts these)
        self.progress = SILENT
        self.feature_dtype = torch.float32

    @property
    @override
    def state_key(self) -> str:
        # Several evaluations may run side by side (e.g. a probe and a fine-tune): one state each.
        return self._generate_state_key(tasks=[t.name for t in self.tasks], method=self.method)

    def _tokenizer(self, trainer: L.Trainer, pl_module: L.LightningModule) -> PreTrainedTokenizerBase:
        tokenizer = getattr(trainer.datamodule, "tokenizer", None)
        if tokenizer is not None:
            return tokenizer  # the data module's, with any added domain tokens
        hparams = getattr(pl_module, "hparams", {})
        name = hparams.get("model_name_or_path")
        if name is None:
            raise MLMAdaptError(
                "downstream: no tokenizer; use a data module with a tokenizer (MLMDataModule)"
            )
        return load_tokenizer(name, hparams.get("new_tokens_file"))

    def prepare(
        self, tokenizer: PreTrainedTokenizerBase, max_length: int, cache_dir: str | None = None
    ) -> None:
        """Loads (into the ``datasets`` cache ``cache_dir``), checks and tokenizes every task (once per
        run)."""
        self.evaluators = [
            TaskEvaluator(load_task(entry, i, cache_dir), tokenizer, max_length, *self.limits)
            for i, entry in enumerate(self.tasks)
        ]
        names = [e.name for e in self.evaluators]
        if len(set(names)) != len(names):
            raise MLMAdaptError(f"downstream.tasks: task names must differ ({', '.join(names)})")

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._attach(trainer)
        # Task rows are forwarded as validation batches are (data.eval_batch_size); without a data module
        # that says, linear_probe's default.
        if hasattr(trainer.datamodule, "eval_batch_size"):
            self.probe_options["batch_size"] = trainer.datamodule.eval_batch_size
        if not self.tasks or self.evaluators:
            return
        cache_dir = getattr(trainer.datamodule, "cache_dir", None)
        limit = position_limit(pl_module.model)[0] or 512
        length = pl_module.hparams.get("max_seq_length") or 512
        self.prepare(self._tokenizer(trainer, pl_module), min(length, limit, 512), cache_dir)

    def evaluate(
        self, model: torch.nn.Module, forward_context: ForwardContext = nullcontext
    ) -> dict[str, float]:
        """Scores every task with ``model`` (a Hugging Face masked LM, left unchanged); metric name -> value.

        ``forward_context`` makes the context each forward pass runs in (e.g. the trainer's autocast).
        """
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        devices = [model.device] if model.device.type == "cuda" else []
        self.progress.note(f"{self.method} of {'; '.join(e.describe() for e in self.evaluators)}")
        # Evaluation must not change the training run: the probe draws no random numbers, but fine-tunes
        # (dropout, head init) do, so the generator state is restored afterwards. ``validate`` and ``test``
        # run under torch.inference_mode, in which the probe and the fine-tune could not train.
        with torch.random.fork_rng(devices=devices), torch.inference_mode(False):
            for evaluator in self.evaluators:
                if self.method == "linear_probe":
                    run, options = evaluator.linear_probe, {**self.probe_options, "dtype": self.feature_dtype}
                else:
                    run, options = evaluator.finetune, self.finetune_options
                scores, spread = run(
                    model, forward_context=forward_context, progress=self.progress, **options
                )
                metrics |= {f"{PREFIX}/{evaluator.name}/{key}": value for key, value in scores.items()}
                metrics |= {f"{PREFIX}/{evaluator.name}/{key}_std": value for key, value in spread.items()}
        metrics[f"{PREFIX}/time_s"] = time.perf_counter() - start
        return metrics

    def _run(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        step = trainer.global_step
        if step not in self.results:
            metrics = self.evaluate(pl_module.model, trainer.precision_plugin.forward_context)
            # Identical on every rank by construction; rank 0's copy makes it exact (GPU kernels may differ).
            self.results[step] = trainer.strategy.broadcast(metrics, src=0)
            shown = ", ".join(
                f"{k.removeprefix(PREFIX + '/')} {v:.4f}" for k, v in self.results[step].items()
            )
            rank_zero_info(f"mlm_adapt downstream ({self.method}) at step {step}: {shown}")
        return self.results[step]

    def _due(self, trainer: L.Trainer) -> bool:
        """Whether this validation's weights get scored: step 0 and outside ``fit`` always; then every
        ``every_n_validations``-th validation for the probe, the final weights for ``finetune``."""
        if trainer.global_step == 0 or trainer.state.fn != "fit" or trainer.global_step in self.results:
            return True
        if self.method == "finetune":
            return trainer.fit_loop.done or trainer.should_stop
        self.validations += 1
        return self.validations % self.every_n_validations == 0

    def _attach(self, trainer: L.Trainer) -> None:
        """Progress as the trainer shows it (bars on rank 0, else one line per phase); features stored in the
        precision the model runs in."""
        bar = trainer.progress_bar_callback is not None and trainer.is_global_zero
        self.progress = Progress("downstream", bars=bar)
        half = {"bf": torch.bfloat16, "16": torch.float16}  # bf16-mixed, bf16-true, 16-mixed, 16-true
        self.feature_dtype = half.get(str(trainer.precision)[:2], torch.float32)

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.evaluators or trainer.sanity_checking or not self._due(trainer):
            return
        step = trainer.global_step
        metrics = self._run(trainer, pl_module)
        if step in self.outside_validation:  # already in the loggers: only this validation's readers see them
            trainer.callback_metrics.update({k: torch.tensor(v) for k, v in metrics.items()})
        else:
            pl_module.log_dict(metrics, sync_dist=True)

    def _log_outside_validation(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.evaluators or trainer.global_step in self.results:
            return
        metrics = self._run(trainer, pl_module)
        self.outside_validation.add(trainer.global_step)
        trainer.callback_metrics.update({k: torch.tensor(v) for k, v in metrics.items()})
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # Step 0, unless the before/after baseline validation already scored it (both run here, not in
        # on_train_start).
        if trainer.global_step == 0:
            self._log_outside_validation(trainer, pl_module)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The final weights when the last step had no scored validation (fine-tuning waits for these).
        if self.method == "finetune" or self.every_n_validations > 1:
            self._log_outside_validation(trainer, pl_module)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"results": self.results, "validations": self.validations}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.results = {int(k): dict(v) for k, v in state_dict.get("results", {}).items()}
        self.validations = int(state_dict.get("validations", 0))
