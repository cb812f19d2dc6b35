"""Writing an export (weights, tokenizer, resolved config, model card) and checking it; its options and the
Hub upload are in :mod:`mlm_adapt.export.options`."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mlm_adapt.data.progress import Progress
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.export.card import CONFIG_FILENAME, ExportInfo, render_model_card
from mlm_adapt.export.merge import CURVE_FILENAME, draw_curve
from mlm_adapt.guard.loads import pretrained_tokenizer
from mlm_adapt.guard.outputs import Output, write_directory
from mlm_adapt.model.loading import position_limit, pretrained_masked_lm

PROBE_TEXTS = ("北京{mask}{mask}你！", "这本书的内容很好，值得一读。", "房间太小，{mask}务也很一般。")


def probe_batch(tokenizer: PreTrainedTokenizerBase, limit: int | None = None) -> dict[str, torch.Tensor]:
    """A small padded batch of probe sentences (with masks) for comparing logits, at most ``limit`` tokens
    each (the model's :func:`~mlm_adapt.model.loading.position_limit`)."""
    texts = [t.format(mask=tokenizer.mask_token) for t in PROBE_TEXTS]
    if limit is None:
        return dict(tokenizer(texts, padding=True, return_tensors="pt"))
    return dict(tokenizer(texts, padding=True, truncation=True, max_length=limit, return_tensors="pt"))


@torch.no_grad()
def verify_export(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    directory: str | Path,
    name: str | Path | None = None,
) -> float:
    """Reloads the saved ``directory`` with the Auto classes, compares its logits with ``model``'s on a probe
    batch, and returns the largest absolute difference (one line above the tolerance, naming the directory
    ``name``: the user's path rather than a staging directory)."""
    name = name or directory
    param = next(model.parameters())
    reloaded, _ = pretrained_masked_lm(str(directory), "export", dtype=param.dtype)
    reloaded = reloaded.to(param.device).eval()
    limit = position_limit(model)[0]
    batch = probe_batch(tokenizer, limit)
    reloaded_batch = probe_batch(pretrained_tokenizer(str(directory), "export"), limit)
    if not torch.equal(batch["input_ids"], reloaded_batch["input_ids"]):
        raise MLMAdaptError(
            f"export check failed: the tokenizer saved in {name} encodes the probe differently"
        )
    was_training = model.training
    model.eval()  # dropout off, as in the reloaded model
    try:
        expected = model(**{k: v.to(param.device) for k, v in batch.items()}).logits.float()
    finally:
        model.train(was_training)
    actual = reloaded(**{k: v.to(param.device) for k, v in reloaded_batch.items()}).logits.float()
    diff = (expected - actual).abs().max().item()
    tolerance = 1e-4 if param.dtype == torch.float32 else 1e-2
    if not diff <= tolerance:
        raise MLMAdaptError(
            f"export check failed: logits of the reloaded {name} differ from the checkpoint's by "
            f"{diff:.3g} (> {tolerance}); the export was not kept"
        )
    return diff


def write_export(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    output: Output,
    info: ExportInfo,
    progress: Progress | None = None,
) -> float:
    """Writes ``model`` + ``tokenizer`` (safetensors), the config and the card in a staging directory under
    ``output``'s lock, checks and publishes them (:func:`~mlm_adapt.guard.outputs.write_directory`) once a
    reload of the staged export gives the model's logits; returns that check's largest logit difference."""
    progress = progress or Progress("export")
    # What the card's tags and usage example say of the model: those of the weights written here.
    info.model_type = info.model_type or getattr(model.config, "model_type", None)
    info.mask_token = tokenizer.mask_token or info.mask_token
    stages = progress.stages(4, f"Exporting to {Path(output.path).name}")
    publishing = progress.phase(f"publishing {output.path}")
    with stages, write_directory(output, publishing) as staging:
        with progress.phase("saving the weights (safetensors)"):
            model.save_pretrained(staging, safe_serialization=True)
        with progress.phase("saving the tokenizer, config and model card"):
            tokenizer.save_pretrained(staging)
            (staging / CONFIG_FILENAME).write_text(info.resolved_config(), encoding="utf-8")
            title = info.repo_id.rsplit("/", 1)[-1] if info.repo_id else output.resolve().name
            render_model_card(info, title=title).save(staging / "README.md")
            if info.merge.get("curve"):
                draw_curve(info.merge, staging / CURVE_FILENAME)
        with progress.phase("reloading the export to compare logits"):
            diff = verify_export(model, tokenizer, staging, name=output.path)
    return diff
