"""The LightningModule: an ``AutoModelForMaskedLM`` trained with the unshifted masked-token cross-entropy,
and its throughput monitor."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy
from torch import nn
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import Perplexity
from transformers import get_scheduler
from typing_extensions import override

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.model.heads import check_document_attention, document_inputs, split_head
from mlm_adapt.model.loading import (
    enable_gradient_checkpointing,
    extend_embeddings,
    head_parameters,
    load_masked_lm,
    position_limit,
)
from mlm_adapt.model.metrics import WordAccuracy, validation_prefix, word_keys
from mlm_adapt.text.blocks import BlockOptions
from mlm_adapt.text.tokenizer import load_tokenizer, read_new_tokens

EVAL_STAGES = ("val", "test")

# Devices with torch's fused Adam/AdamW kernel (torch.optim.optimizer's list of fused-capable devices).
FUSED_ADAM_DEVICES = ("cpu", "cuda", "mps", "xpu", "hpu")


def default_optimizer(params: Any) -> torch.optim.Optimizer:
    """AdamW with BERT fine-tuning defaults (lr 5e-5, weight decay 0.01)."""
    return torch.optim.AdamW(params, lr=5e-5, weight_decay=0.01)


def fastest_kernels(optimizer: torch.optim.Optimizer, clipping: bool = False) -> torch.optim.Optimizer:
    """Adam/AdamW left at torch's defaults steps with the fused kernel (the same update) where the parameters
    allow; torch picks it only when asked (else a for-loop on CPU, ~4x slower at bert-base size). A
    ``fused`` or ``foreach`` set in the config is kept, and so is torch's choice where fused cannot run.

    With ``clipping`` (``trainer.gradient_clip_val``), any optimizer that would unscale gradients inside its
    own step (a fused kernel, ours or the config's) leaves unscaling to ``GradScaler`` instead: Lightning
    clips only gradients it has unscaled itself, and refuses to clip otherwise. The fused kernel then steps
    on gradients already unscaled, under every precision.
    """
    if isinstance(optimizer, torch.optim.Adam) and _may_fuse(optimizer):  # AdamW is an Adam
        for group in optimizer.param_groups:
            group["fused"] = True
        optimizer.defaults["fused"] = True
        # What the constructor sets with fused=True: GradScaler hands the kernel its scale and inf check.
        optimizer._step_supports_amp_scaling = True
    if clipping and getattr(optimizer, "_step_supports_amp_scaling", False):
        optimizer._step_supports_amp_scaling = False
    return optimizer


def _may_fuse(optimizer: torch.optim.Optimizer) -> bool:
    groups = optimizer.param_groups
    chosen = any(g.get("fused") is not None or g.get("foreach") is not None for g in groups)
    params = [p for g in groups for p in g["params"]]
    capable = all(p.device.type in FUSED_ADAM_DEVICES and torch.is_floating_point(p) for p in params)
    return not chosen and capable and not any(g.get("differentiable") for g in groups)


def mlm_flops(
    config: Any, batch_size: int, seq_len: int, n_predicted: int, backward: bool = True
) -> int | None:
    """Matmul FLOPs of one BERT-style masked-LM step (the usual 6ND-style count, attention included), or
    ``None`` when ``config`` lacks a size.

    Per token and layer: ``2 * (4 h^2 + 2 h I)`` for the projections and feed-forward, ``4 L h`` for the
    attention scores and weighted sum (``seq_len`` padded: padding is computed); the head costs
    ``2 * (h^2 + h V)`` per position in ``n_predicted`` (only the masked ones with the masked-only head). A
    ``backward`` pass costs twice the forward. Embedding lookups, norms and softmax are left out.
    """
    try:
        h, layers = int(config.hidden_size), int(config.num_hidden_layers)
        inter, vocab = int(config.intermediate_size), int(config.vocab_size)
    except (AttributeError, TypeError):
        return None
    tokens = batch_size * seq_len
    encoder = tokens * layers * (2 * (4 * h * h + 2 * h * inter) + 4 * seq_len * h)
    head = n_predicted * 2 * (h * h + h * vocab)
    return (encoder + head) * (3 if backward else 1)


def _samples(batch: dict[str, torch.Tensor]) -> int:
    return int(batch["input_ids"].shape[0])


def _real_tokens(batch: dict[str, torch.Tensor]) -> int:
    return int(batch["attention_mask"].sum())


class MLMThroughputMonitor(ThroughputMonitor):
    """Lightning's ``ThroughputMonitor`` fed with masked-LM batches: logs ``train/device/samples_per_sec``,
    ``batches_per_sec``, ``items_per_sec`` (non-padding tokens), ``flops_per_sec`` (from the module's
    ``flops_per_batch``, :func:`mlm_flops`) and, on GPUs whose peak Lightning knows, ``mfu``; and
    ``train/non_pad_fraction`` every step.

    Args:
        window_size: Batches in the sliding window the rates are computed over.
        separator: Separator in the logged metric names.
    """

    def __init__(self, window_size: int = 20, separator: str = "/"):
        super().__init__(_samples, _real_tokens, window_size=window_size, separator=separator)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *args: Any
    ) -> None:
        mask = batch["attention_mask"]
        pl_module.log("train/non_pad_fraction", mask.float().mean(), batch_size=mask.shape[0])
        super().on_train_batch_end(trainer, pl_module, outputs, batch, *args)


# Where a checkpoint holds the tokens ``model.new_tokens_file`` added (see ``model.checkpoints``).
NEW_TOKENS_KEY = "mlm_adapt_new_tokens"
# What the base checkpoint's masked-LM head was when the run started (model.loading.check_head).
HEAD_KEY = "mlm_adapt_base_head"
# The format of the checkpoints fit writes (what the run's state holds and where: the resume record, the
# replay state, the new tokens). The tool's own files are trusted: one whose format differs is refused in
# one line, never read field by field. Raise it whenever that state changes shape or meaning.
CHECKPOINT_FORMAT_KEY = "mlm_adapt_checkpoint_format"
CHECKPOINT_FORMAT = 4


def check_checkpoint_format(
    checkpoint: Mapping[str, Any], path: object = "the checkpoint", key: str = "ckpt_path"
) -> None:
    """Refuses, in one line naming option ``key`` and the file, a checkpoint of another format."""
    found = checkpoint.get(CHECKPOINT_FORMAT_KEY)
    if found != CHECKPOINT_FORMAT:
        written = "mlm_adapt 0.2 or earlier (or not by mlm_adapt)" if found is None else f"format {found}"
        raise MLMAdaptError(
            f"{key}: {path} was written by {written}, and this mlm_adapt reads checkpoint format "
            f"{CHECKPOINT_FORMAT}; export it with the mlm_adapt that wrote it, then start a new run from "
            "that export (model.model_name_or_path=EXPORT_DIR)"
        )


class MaskedLMModule(L.LightningModule):
    """Continues masked-LM pretraining of a BERT-family model on domain text.

    Args:
        model_name_or_path: Hub name (e.g. ``hfl/chinese-bert-wwm-ext``) or local directory of the model.
        max_seq_length: Longest input in tokens, within the model's position limit (= data.max_seq_length).
        optimizer: Optimizer factory; biases and LayerNorm weights always get ``weight_decay=0``.
        lr_schedule: Learning-rate decay after warmup: ``linear``, ``cosine`` or ``constant``.
        warmup: Warmup length: a fraction of the total optimizer steps if below 1, else a step count.
        pretrained: Start from the checkpoint's weights (``false``: random init, i.e. from scratch).
        attn_implementation: Attention kernel: ``sdpa`` (default), ``eager``, or ``null`` for the library's.
        masked_only_head: Project only masked positions to the vocabulary: same loss, less compute and memory.
        new_tokens_file: Tokens to add, one per line (``mlm_adapt vocab --output_tokens``), each embedding the
            mean of its old pieces' (= ``data.new_tokens_file``).
        compile: ``torch.compile`` the encoder and head in place (checkpoints unchanged); pays off on GPUs.
            ``true``, or the keyword arguments of ``torch.compile`` (e.g. ``{mode: max-autotune}``).
        gradient_checkpointing: Recompute activations in the backward pass (non-reentrant): much less memory
            for about a third more compute, same loss and gradients.
        allow_partial_head: Load a checkpoint that holds only part of its masked-LM head, the missing weights
            starting random (refused otherwise). An encoder-only checkpoint (no head at all) always loads.
        head_warmup_steps: Optimizer steps that train the masked-LM head alone, the encoder and embeddings
            unchanged, before the whole model: an untrained head (an encoder-only checkpoint) would otherwise
            push large gradients into the pretrained encoder. The before column is scored after them.
    """

    def __init__(
        self,
        model_name_or_path: str = "hfl/chinese-bert-wwm-ext",
        max_seq_length: int = 512,
        optimizer: OptimizerCallable = default_optimizer,
        lr_schedule: Literal["linear", "cosine", "constant"] = "linear",
        warmup: float = 0.06,
        pretrained: bool = True,
        attn_implementation: str | None = "sdpa",
        masked_only_head: bool = True,
        new_tokens_file: str | None = None,
        compile: bool | dict[str, Any] = False,
        gradient_checkpointing: bool = False,
        allow_partial_head: bool = False,
        head_warmup_steps: int = 0,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        if head_warmup_steps < 0:
            raise MLMAdaptError(f"model.head_warmup_steps={head_warmup_steps} must be >= 0")
        if warmup < 0:
            raise MLMAdaptError(f"model.warmup={warmup} must be >= 0 (fraction < 1 or a number of steps)")
        self.optimizer = optimizer
        # from_pretrained returns the model in eval mode; Lightning expects train mode at fit start.
        # ``head``: what the base checkpoint's masked-LM head was (loading.check_head; None: random init).
        self.model, self.head = load_masked_lm(
            model_name_or_path, pretrained, attn_implementation, allow_partial_head
        )
        self.model.train()
        limit, found = position_limit(self.model)
        if limit is not None and max_seq_length > limit:
            raise MLMAdaptError(
                f"model.max_seq_length={max_seq_length} exceeds the position limit {limit} of "
                f"{model_name_or_path!r} ({found}); set it to {limit} or less"
            )
        self.mask_token_id: int | None = None
        # The tokens themselves go into every checkpoint: what the checkpoint is read back with never
        # comes from a file it names (a crafted checkpoint could name any local file to publish).
        self.new_tokens: list[str] = read_new_tokens(new_tokens_file) if new_tokens_file else []
        if self.new_tokens:
            extend_embeddings(self.model, load_tokenizer(model_name_or_path), self.new_tokens)
        if gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        self.head_split = split_head(self.model) if masked_only_head else None
        # Per prefix: ``val``, ``test`` and ``val_<name>`` of further validation sets.
        self.accuracy, self.word_accuracy, self.perplexity = nn.ModuleDict(), nn.ModuleDict(), nn.ModuleDict()
        for stage in EVAL_STAGES:
            self._add_eval_metrics(stage)
        self.baseline_metrics: dict[str, float] = {}  # step-0 validation metrics, kept in checkpoints
        self.last_validated_step = -1
        self.flops_per_batch: int | None = None  # of the latest batch, read by the ThroughputMonitor
        # Of the optimizer step in progress: [summed loss, masked count] on this rank, and the divisor C.
        self._step_sums: torch.Tensor | None = None
        self._step_estimate: torch.Tensor | None = None
        self._compiled = False

    def _add_eval_metrics(self, prefix: str) -> None:
        self.accuracy[prefix] = MulticlassAccuracy(self.model.config.vocab_size, average="micro")
        self.word_accuracy[prefix] = WordAccuracy()
        self.perplexity[prefix] = Perplexity()

    def _validation_prefix(self, dataloader_idx: int) -> str:
        """The metric prefix of a validation set, creating its metrics on first use."""
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        prefix = validation_prefix(dataloader_idx, getattr(datamodule, "validation_set_names", ()))
        if prefix not in self.accuracy:
            self._add_eval_metrics(prefix)
            for metrics in (self.accuracy, self.word_accuracy, self.perplexity):
                metrics[prefix].to(self.device)
        return prefix

    @override
    def setup(self, stage: str) -> None:
        blocks = getattr(self.trainer.datamodule, "blocks", None)
        if isinstance(blocks, BlockOptions) and blocks.document_attention:  # refused before any step
            check_document_attention(self.model)
        # Before the strategy moves and wraps the module: one set of metrics per validation set.
        for index in range(1, len(getattr(self.trainer.datamodule, "validation_set_names", ()))):
            self._validation_prefix(index)
        # One sequence for Lightning's model summary, which then shows real FLOPs instead of a column of 0.
        # Rank 0 runs it alone, so only where the module holds all its weights (not FSDP/DeepSpeed shards);
        # not compiled, where it would compile for this shape first.
        whole = isinstance(self.trainer.strategy, (SingleDeviceStrategy, DDPStrategy))
        if whole and not isinstance(self.trainer.strategy, DeepSpeedStrategy) and not self.hparams.compile:
            length = self.hparams.max_seq_length
            self.example_input_array = {
                "input_ids": torch.zeros(1, length, dtype=torch.long),
                "attention_mask": torch.ones(1, length, dtype=torch.long),
            }

    @override
    def configure_model(self) -> None:
        if self.hparams.compile and not self._compiled:
            # Module.compile works in place: state_dict keys (checkpoints, save_pretrained) are unchanged.
            for module in self.head_split.modules if self.head_split else (self.model,):
                module.compile(**(self.hparams.compile if isinstance(self.hparams.compile, dict) else {}))
            self._compiled = True

    @override
    def configure_callbacks(self) -> list[L.Callback]:
        # Throughput (tokens/s, MFU) is always logged, unless the trainer has a ThroughputMonitor of its own:
        # its CUDA sync per step is one a progress bar showing the step's loss makes anyway.
        if self._trainer is None:
            return []
        has_one = any(isinstance(c, ThroughputMonitor) for c in self.trainer.callbacks)
        return [] if has_one else [MLMThroughputMonitor()]

    def masked_logits(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Vocabulary logits and labels of the masked positions only: ``(N, V)`` and ``(N,)``."""
        labels = batch["labels"]
        selected = labels != -100
        attention_mask = batch["attention_mask"]  # 1 on [MASK]: it is attended as any token (BERT's rule)
        inputs = {"input_ids": batch["input_ids"], "attention_mask": attention_mask}
        if (
            "document_ids" in batch
        ):  # data.blocks.document_attention: packed documents attend only to themselves
            inputs.update(
                document_inputs(self.model, attention_mask, batch["document_ids"], batch["position_ids"])
            )
        if self.head_split is None:
            return self.model(**inputs).logits[selected], labels[selected]
        return self.head_split.head(self.head_split.hidden(**inputs)[selected]), labels[selected]

    @override
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Full ``(B, L, V)`` vocabulary logits."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def masked_lm_loss(
        self, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Mean unshifted cross-entropy over masked positions (0, not NaN, without any), logits, labels."""
        logits, labels = self.masked_logits(batch)
        loss = F.cross_entropy(logits.float(), labels, reduction="sum") / max(labels.numel(), 1)
        return loss, logits, labels

    def masked_lm_sum(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        """Summed unshifted cross-entropy over masked positions, and their number."""
        logits, labels = self.masked_logits(batch)
        return F.cross_entropy(logits.float(), labels, reduction="sum"), labels.numel()

    def _count_flops(self, batch: dict[str, torch.Tensor], n_masked: int, backward: bool) -> None:
        batch_size, seq_len = batch["input_ids"].shape
        n_predicted = n_masked if self.head_split is not None else batch_size * seq_len
        self.flops_per_batch = mlm_flops(self.model.config, batch_size, seq_len, n_predicted, backward)

    def _shared_step(self, batch: dict[str, torch.Tensor], stage: str) -> torch.Tensor:
        loss, logits, labels = self.masked_lm_loss(batch)
        n_masked = labels.numel()
        self._count_flops(batch, n_masked, backward=False)
        # Explicit names per set (val/*, val_<name>/*), not Lightning's dataloader_idx suffix. Weighted by
        # the masked count, and synced as sum/count: the epoch's value is the mean per masked token of the
        # whole set, across batches and ranks.
        log = {"add_dataloader_idx": False, "batch_size": max(n_masked, 1)}
        self.log(f"{stage}/loss", loss, prog_bar=stage in EVAL_STAGES, sync_dist=True, **log)
        if n_masked:
            self.accuracy[stage](logits, labels)
            self.perplexity[stage](logits[None].float(), labels[None])
            self.log(f"{stage}/accuracy", self.accuracy[stage], **log)
            self.log(f"{stage}/perplexity", self.perplexity[stage], prog_bar=stage == "val", **log)
            if "word_ids" in batch:
                keys = word_keys(batch["word_ids"], batch["labels"] != -100)
                self.word_accuracy[stage](logits.argmax(-1) == labels, keys)
                self.log(f"{stage}/word_accuracy", self.word_accuracy[stage], **log)
        return loss

    @override
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if "maskable_tokens" in batch:  # the realized rate, to check a masking-rate schedule against
            maskable = batch["maskable_tokens"].sum().clamp(min=1)
            rate = (batch["labels"] != -100).sum() / maskable
            self.log("train/mlm_probability", rate.float(), batch_size=batch["input_ids"].shape[0])
        if "replay_rate" in batch:  # general-text replay (data.replay.files): the step's rate
            self.log(
                "train/replay_rate", batch["replay_rate"].float(), batch_size=batch["input_ids"].shape[0]
            )
        return self._step_normalized_loss(batch)

    def _step_normalized_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """This micro-batch's part of the optimizer step's loss: its summed masked-token cross-entropy over
        the step's masked-token count, so that every masked token of the step weighs the same, whatever its
        micro-batch or rank (a per-micro-batch mean would weigh a token of a sparsely masked micro-batch
        more).

        The count of the step's later micro-batches is not known before their forward. Each micro-batch is
        divided by an estimate ``C`` (the first micro-batch's count, summed over ranks, times the
        accumulation), identical on every rank, and :meth:`on_before_optimizer_step` multiplies the
        accumulated gradients by ``C / N`` once the step's count ``N`` is known: the same gradients as
        dividing by ``N`` before the backward (gradients are linear in the loss). Without accumulation
        ``C`` is ``N`` and nothing is rescaled. Clipping and the optimizer then see these gradients.
        """
        sum_loss, n_masked = self.masked_lm_sum(batch)
        self._count_flops(batch, n_masked, backward=True)
        accumulation = int(getattr(self.trainer, "accumulate_grad_batches", 1) or 1)
        world_size = int(getattr(self.trainer, "world_size", 1) or 1)
        count = torch.tensor(float(n_masked), device=sum_loss.device)
        if self._step_sums is None:  # the step's first micro-batch on this rank (every rank is at it)
            self._step_estimate = self._sum_over_ranks(count.clone()) * accumulation
            self._step_sums = torch.zeros(2, device=sum_loss.device)
        self._step_sums += torch.stack([sum_loss.detach(), count])
        # Lightning divides by the accumulation and DDP/FSDP average over ranks: both are undone here.
        return sum_loss * (accumulation * world_size) / self._step_estimate.clamp(min=1)

    def _sum_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        if getattr(self.trainer, "world_size", 1) <= 1:
            return value
        return self.trainer.strategy.reduce(value, reduce_op="sum")

    def encoder_parameters(self) -> list[nn.Parameter]:
        """Every parameter but the masked-LM head's own (a decoder tied to the embeddings is not its own)."""
        head = {id(p) for p in head_parameters(self.model).values()}
        return [p for p in self.model.parameters() if id(p) not in head]

    @override
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.global_step < self.hparams.get("head_warmup_steps", 0):
            for param in self.encoder_parameters():  # the head alone learns: no update, no weight decay
                param.grad = None
        if self._step_sums is None:
            return
        total_loss, total_count = self._sum_over_ranks(self._step_sums).unbind()  # one all-reduce per step
        estimate, self._step_sums, self._step_estimate = self._step_estimate, None, None
        if getattr(self.trainer, "accumulate_grad_batches", 1) > 1:
            factor = estimate.clamp(min=1) / total_count.clamp(min=1)
            by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
            for param in self.parameters():
                if param.grad is not None:
                    by_kind.setdefault((param.grad.device, param.grad.dtype), []).append(param.grad)
            for (device, dtype), grads in by_kind.items():
                torch._foreach_mul_(grads, factor.to(device=device, dtype=dtype))
        # The mean per masked token of the whole step, the same value on every rank. Logged per step only,
        # so the batch size Lightning asks for weighs nothing (and reading the count would sync the host).
        self.log("train/loss", total_loss / total_count.clamp(min=1), prog_bar=True, batch_size=1)

    @override
    def validation_step(
        self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        # Several validation sets (data.validation_files as a mapping): one loader and prefix per set.
        self._shared_step(batch, self._validation_prefix(dataloader_idx))

    @override
    def on_validation_epoch_end(self) -> None:
        self.last_validated_step = self.global_step

    @override
    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._shared_step(batch, "test")

    @override
    def configure_optimizers(self) -> dict[str, Any]:
        decay, no_decay = [], []
        for param in self.model.parameters():
            if param.requires_grad:
                (decay if param.ndim >= 2 else no_decay).append(param)  # 1-D: biases and LayerNorm weights
        optimizer = fastest_kernels(
            self.optimizer([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]),
            clipping=bool(getattr(self.trainer, "gradient_clip_val", None)),
        )
        total_steps = int(self.trainer.estimated_stepping_batches)
        warmup = self.hparams.warmup
        warmup_steps = round(warmup * total_steps) if warmup < 1 else int(warmup)
        name = {"constant": "constant_with_warmup"}.get(self.hparams.lr_schedule, self.hparams.lr_schedule)
        scheduler = get_scheduler(
            name, optimizer, num_warmup_steps=min(warmup_steps, total_steps), num_training_steps=total_steps
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_FORMAT_KEY] = CHECKPOINT_FORMAT
        checkpoint[HEAD_KEY] = self.head
        checkpoint["mlm_adapt_baseline_metrics"] = dict(self.baseline_metrics)
        checkpoint[NEW_TOKENS_KEY] = list(self.new_tokens)

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        check_checkpoint_format(checkpoint, getattr(self._trainer, "ckpt_path", None) or "the checkpoint")
        self.baseline_metrics = dict(checkpoint.get("mlm_adapt_baseline_metrics", {}))
        self.head = checkpoint.get(HEAD_KEY)
