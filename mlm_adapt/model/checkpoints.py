"""Reading the trainer's checkpoints back: single files (single device, DDP, FSDP full) and FSDP shards."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.load import _METADATA_FILENAME
from lightning.pytorch.utilities.consolidate_checkpoint import _format_checkpoint
from transformers import PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError, check_checkpoint_path, check_model_path
from mlm_adapt.guard.loads import (
    check_sharded_metadata,
    is_sharded_checkpoint,
    load_sharded,
    load_weights_only,
)
from mlm_adapt.model.loading import extend_embeddings
from mlm_adapt.model.module import NEW_TOKENS_KEY, MaskedLMModule, check_checkpoint_format
from mlm_adapt.text.tokenizer import extend_tokenizer, load_tokenizer


def _checkpoint_path(path: str | Path, key: str) -> tuple[Path, bool]:
    """``path`` and whether it is an FSDP sharded checkpoint directory; one line if it is neither that nor
    a file (a DeepSpeed directory gets its conversion)."""
    path = Path(path)
    check_checkpoint_path(path, key)
    if not path.is_dir():
        return path, False
    if is_sharded_checkpoint(path):
        return path, True
    if (path / "latest").is_file() or (path / "checkpoint").is_dir():
        raise MLMAdaptError(
            f"{key}: {path} is a DeepSpeed checkpoint; make it one file first with lightning.pytorch."
            "utilities.deepspeed.convert_zero_checkpoint_to_fp32_state_dict(DIR, FILE.ckpt)"
        )
    raise MLMAdaptError(
        f"{key}: {path} is a directory but neither a checkpoint (no .metadata: not FSDP shards) nor, "
        "having no config.json, a Hugging Face model directory; give a .ckpt file the trainer wrote"
    )


def load_checkpoint(path: str | Path, key: str = "--ckpt_path") -> dict[str, Any]:
    """Loads a Lightning checkpoint into CPU memory as one full dictionary, weights-only (a file that would
    run code is refused): a file (single device, DDP, FSDP ``full``) or an FSDP sharded directory,
    consolidated by Lightning's own utilities (as ``lightning.pytorch.utilities.consolidate_checkpoint``)."""
    path, sharded = _checkpoint_path(path, key)
    if sharded:
        return _format_checkpoint(load_sharded(path, key))
    checkpoint = load_weights_only(path, key)
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise MLMAdaptError(f"{key}: {path} has no 'state_dict'; give a checkpoint written by the trainer")
    check_checkpoint_format(checkpoint, path, key)
    return checkpoint


def saved_checkpoints(callback: Any) -> set[str]:
    """The checkpoint files (or sharded directories) a ``ModelCheckpoint`` has saved and still keeps: its
    best k, its best and its last."""
    paths = [*callback.best_k_models, callback.best_model_path, callback.last_model_path]
    return {str(p) for p in paths if p and Path(p).exists()}


def checkpoint_metadata(path: str | Path, key: str = "ckpt_path") -> dict[str, Any]:
    """A checkpoint's entries without reading its weights (memory-mapped), the whole pickle still checked
    weights-only before Lightning reads it; for an FSDP sharded directory, its ``meta.pt``."""
    path, sharded = _checkpoint_path(path, key)
    if sharded:
        check_sharded_metadata(path, key)
        meta = path / _METADATA_FILENAME
        checkpoint = load_weights_only(meta, key) if meta.is_file() else {}
    else:
        checkpoint = load_weights_only(path, key, mmap=True)
    if not isinstance(checkpoint, dict):
        raise MLMAdaptError(f"{key}: {path} is not a Lightning checkpoint; give a .ckpt file of fit")
    check_checkpoint_format(checkpoint, path, key)
    return checkpoint


def checkpoint_new_tokens(checkpoint: dict[str, Any], key: str = "--ckpt_path") -> list[str]:
    """The tokens ``model.new_tokens_file`` added in the run, as the checkpoint holds them: never read from
    the file it names (a checkpoint crafted to name ``~/.aws/credentials`` would publish its lines)."""
    tokens = checkpoint.get(NEW_TOKENS_KEY) or []
    if not isinstance(tokens, list) or not all(isinstance(t, str) and t for t in tokens):
        raise MLMAdaptError(f"{key}: the checkpoint's {NEW_TOKENS_KEY} is not a list of tokens")
    return tokens


def module_from_checkpoint(
    checkpoint: dict[str, Any], base_model: str | None = None, key: str = "--ckpt_path"
) -> MaskedLMModule:
    """Rebuilds the trained ``MaskedLMModule`` (in eval mode, on CPU) from a loaded checkpoint (named by
    ``key``). The architecture comes from the config of the base model the checkpoint records, or of
    ``base_model`` when that one is not available here; the checkpoint's weights replace its own."""
    hparams = dict(checkpoint.get("hyper_parameters") or {})
    if "model_name_or_path" not in hparams and base_model is None:
        raise MLMAdaptError(f"{key}: the checkpoint records no model.model_name_or_path; pass --base_model")
    accepted = inspect.signature(MaskedLMModule.__init__).parameters
    kwargs = {k: v for k, v in hparams.items() if k in accepted}
    if base_model is not None:
        check_model_path(base_model, "--base_model")
        kwargs["model_name_or_path"] = base_model
    kwargs["pretrained"] = False  # skip reading the base weights: the checkpoint's replace them
    kwargs.pop("new_tokens_file", None)  # the checkpoint's own tokens instead (checkpoint_new_tokens)
    new_tokens = checkpoint_new_tokens(checkpoint, key)
    try:
        module = MaskedLMModule(**kwargs)
    except MLMAdaptError as exc:
        if base_model is not None:  # the model named by --base_model, not by the checkpoint's hparams
            reason = str(exc).removeprefix("model.model_name_or_path: ")
            raise MLMAdaptError(f"--base_model: {reason}") from None
        raise MLMAdaptError(
            f"{exc} (needed to rebuild the checkpoint's model; or pass --base_model DIR)"
        ) from None
    if new_tokens:
        extend_embeddings(module.model, load_tokenizer(kwargs["model_name_or_path"]), new_tokens)
        module.new_tokens = new_tokens
    missing, unexpected = module.load_state_dict(checkpoint["state_dict"], strict=False)
    # Tied weights (the decoder shares the word embeddings) may legitimately be absent from the file.
    tied = set(getattr(module.model, "_tied_weights_keys", None) or {})
    missing = [m for m in missing if m.removeprefix("model.") not in tied]
    if missing or unexpected:
        raise MLMAdaptError(
            f"{key}: the checkpoint's weights do not fit {kwargs['model_name_or_path']!r} "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]}); pass the right --base_model"
        )
    module.model.tie_weights()
    module.on_load_checkpoint(checkpoint)
    return module.eval()


def callback_state(checkpoint: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The saved state of the callback whose class is called ``name`` (empty if it was not in the run)."""
    for state_key, state in (checkpoint.get("callbacks") or {}).items():
        if state_key == name or state_key.startswith(name + "{"):
            return dict(state)
    return {}


def tokenizer_for(checkpoint: dict[str, Any], base_model: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer a checkpoint was trained with (or ``base_model``'s), its new tokens included."""
    model_hparams = checkpoint.get("hyper_parameters") or {}
    data_hparams = checkpoint.get("datamodule_hyper_parameters") or {}
    name = base_model or data_hparams.get("tokenizer_name_or_path") or model_hparams.get("model_name_or_path")
    if name is None:
        raise MLMAdaptError("--ckpt_path: the checkpoint records no tokenizer; pass --base_model")
    key = "--base_model" if base_model else "model.model_name_or_path (recorded in the checkpoint)"
    tokenizer = load_tokenizer(name, key=key)
    extend_tokenizer(tokenizer, checkpoint_new_tokens(checkpoint))
    return tokenizer
