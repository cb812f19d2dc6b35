"""Loading a masked LM: its size against the memory and its weights against its config before anything is
allocated (else an absurd size ends in torch's allocator error after minutes of swapping, and an edited
``config.json`` in transformers' ``ignore_mismatched_sizes`` traceback), decoders refused, new tokens added.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from transformers import AutoModelForMaskedLM, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.initialization import no_init_weights
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING

from mlm_adapt.errors import MLMAdaptError, exception_line
from mlm_adapt.guard.loads import (
    TRUST_REMOTE_CODE,
    check_config_dir,
    check_local,
    check_weight_files,
    pretrained_config,
    safe_line,
    weight_files,
    weight_shapes,
)
from mlm_adapt.text.tokenizer import extend_tokenizer

_CAUSAL_SUFFIXES = ("LMHeadModel", "ForCausalLM")

# Deeper configs are counted from two small builds instead of one full one: a meta build still constructs
# every module in Python (~1.5 ms a layer), and 10,000 layers would take longer than the refusal is worth.
EXACT_DEPTH = 256
# Parameters, gradients and AdamW's two moments, each one value per parameter in the training dtype.
TRAINING_COPIES = 4
_SHOWN_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size")
_GB = 1e9


@dataclass(frozen=True)
class ModelSize:
    """What a config describes: its parameter count (tied weights once), the bytes of one value in its
    dtype, and its meta-device model when it was built whole (for comparing shapes)."""

    parameters: int
    bytes_per_value: int
    model: PreTrainedModel | None = None

    def needed(self, training: bool) -> int:
        """Bytes to hold the parameters, and for ``training`` their gradients and AdamW's two moments."""
        return self.parameters * self.bytes_per_value * (TRAINING_COPIES if training else 1)


def meta_masked_lm(config: PretrainedConfig) -> PreTrainedModel:
    """The config's masked LM on the ``meta`` device: every parameter's shape, no storage, no init."""
    config = copy.deepcopy(config)  # from_config writes the resolved dtype and attention back into it
    with torch.device("meta"), no_init_weights():
        model = AutoModelForMaskedLM.from_config(config, trust_remote_code=False)
        model.tie_weights()  # no_init_weights skips init_weights, which ties the output embeddings
    return model


def _count(model: PreTrainedModel) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() lists a tied weight once


def model_size(config: PretrainedConfig) -> ModelSize:
    """Counts the parameters ``config`` describes on the meta device, built whole up to :data:`EXACT_DEPTH`
    layers, else from builds of 2 and 3 layers (the first may differ, as in ModernBERT; the others repeat)."""
    dtype = getattr(config, "dtype", None)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    width = dtype.itemsize if isinstance(dtype, torch.dtype) else 4
    depth = getattr(config, "num_hidden_layers", None)
    if not isinstance(depth, int) or depth <= EXACT_DEPTH:
        model = meta_masked_lm(config)
        return ModelSize(_count(model), width, model)
    counts = []
    for layers in (2, 3):
        shallow = copy.deepcopy(config)
        shallow.num_hidden_layers = layers
        for name, value in vars(config).items():  # per-layer lists (ModernBERT's layer_types) follow
            if isinstance(value, list) and len(value) == depth:
                setattr(shallow, name, value[:layers])
        counts.append(_count(meta_masked_lm(shallow)))
    return ModelSize(counts[0] + (depth - 2) * (counts[1] - counts[0]), width)


def available_memory(device: torch.device | str = "cpu") -> int | None:
    """Free bytes on ``device``: CUDA's free memory; for ``cpu`` Linux's ``MemAvailable`` (what can be
    allocated without swapping), or less under a cgroup v2 memory limit (a container's); else ``None``."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    known = []
    with contextlib.suppress(OSError, AttributeError):
        meminfo = Path("/proc/meminfo").read_text(encoding="ascii")
        known.append(int(re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.MULTILINE).group(1)) * 1024)
    with contextlib.suppress(OSError, ValueError):  # memory.max "max": no limit
        cgroup = Path("/sys/fs/cgroup")
        limit = int((cgroup / "memory.max").read_text(encoding="ascii"))
        known.append(limit - int((cgroup / "memory.current").read_text(encoding="ascii")))
    return min(known) if known else None


def _where(device: torch.device) -> str:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"GPU {index} has"
    return "this machine has"


def _gb(n: int) -> str:
    return f"{n / _GB:.1f}" if n < 10 * _GB else f"{n / _GB:.0f}"


def config_source(name: str) -> str:
    """How a message names the config of ``name``: the local ``config.json`` path or the Hub name's."""
    path = Path(name).expanduser()
    return str(path / "config.json") if path.is_dir() else f"{name!r} (its config.json)"


def check_fits(
    config: PretrainedConfig,
    size: ModelSize,
    source: str,
    key: str,
    training: bool,
    device: torch.device | str = "cpu",
    already_held: int = 0,
) -> None:
    """Refuses, in one line naming ``key`` and ``source`` (the config file), a model of ``size`` that cannot
    fit in ``device``'s free memory, with its gradients and AdamW's moments when ``training``, less the
    ``already_held`` bytes of it there."""
    device = torch.device(device)
    available = available_memory(device)
    needed = size.needed(training) - already_held
    if available is None or needed <= available:
        return
    shown = ", ".join(f"{name} {getattr(config, name)}" for name in _SHOWN_SIZES if hasattr(config, name))
    width = size.bytes_per_value
    dtype = {2: "16-bit", 4: "float32", 8: "float64"}.get(width, f"{width}-byte")
    what = "training" if training else "loading"
    state = " (parameters, gradients and AdamW's two moments)" if training else ""
    raise MLMAdaptError(
        f"{key}: {source} describes {size.parameters / 1e9:.2f} B parameters ({shown}); {what} them in "
        f"{dtype} needs ~{_gb(needed)} GB{state}, "
        f"{_where(device)} {_gb(available)} GB available; lower these sizes in the config (or pick a smaller "
        "model), or train where more memory is free (a larger GPU, or FSDP/DeepSpeed across several)"
    )


def _model_key(name: str, model_keys: set[str], prefix: str) -> str | None:
    """The model's name for a file's tensor: the same, with the legacy ``gamma``/``beta`` names or without
    (or with) the base model's prefix, as transformers' loader renames them."""
    name = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", name))
    candidates = [name, name[len(prefix) + 1 :] if name.startswith(prefix + ".") else f"{prefix}.{name}"]
    return next((c for c in candidates if c in model_keys), None)


def check_weight_shapes(directory: Path, model: PreTrainedModel, key: str) -> None:
    """Refuses weight files of ``directory`` whose tensors disagree in shape with ``model`` (the meta-device
    model of its ``config.json``), naming both files, the first tensor, both shapes and how many tensors had
    no counterpart. Only tensors on both sides are compared (a checkpoint may leave out tied or unused heads).
    """
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    prefix = getattr(model, "base_model_prefix", "") or ""
    names = set(expected)
    for path in weight_files(directory):
        shapes = weight_shapes(path, key)
        matched = {name: _model_key(name, names, prefix) for name in shapes}
        compared = {target: shapes[name] for name, target in matched.items() if target is not None}
        for target, model_shape in expected.items():
            if target in compared and compared[target] != model_shape:
                unmatched = len(shapes) - len(compared)
                raise MLMAdaptError(
                    f"{key}: {path} and {directory / 'config.json'} disagree: tensor {target!r} is "
                    f"{list(compared[target])} in the weights but {list(model_shape)} by the config "
                    f"({len(compared)} tensors compared, {unmatched} without a counterpart in the model); "
                    "restore the config.json saved with these weights, or the weights saved with it"
                )


def check_masked_lm(
    config: PretrainedConfig, name: str, key: str, pretrained: bool, training: bool
) -> ModelSize:
    """Every check before the masked LM ``config`` (from ``name``, named by ``key``) is allocated: when
    ``pretrained``, a local directory's weight files against the config; then its size (with training's
    gradients and AdamW moments when ``training``). Returns the size."""
    try:
        size = model_size(config)
    except Exception as exc:  # the model's own constructor rejects its config (ValueError, IndexError, ...)
        if isinstance(exc, ValueError) and "Unrecognized configuration class" in str(exc):
            raise  # no masked-LM head: the caller names that
        raise MLMAdaptError(
            f"{key}: {config_source(name)} describes no model transformers can build "
            f"({type(exc).__name__}: {exception_line(exc)}); fix the config or give a save_pretrained "
            "directory"
        ) from None
    path = Path(name).expanduser()
    directory = path if pretrained and path.is_dir() else None
    if directory is not None and size.model is not None:
        check_weight_shapes(directory, size.model, key)  # a mismatch explains a size better than the size
    check_fits(config, size, config_source(name), key, training)
    if directory is not None and size.model is None:  # deep: built whole only once it is known to fit
        check_weight_shapes(directory, meta_masked_lm(config), key)
    return size


def check_trainer_fits(
    model: PreTrainedModel, name: str, key: str, device: torch.device, precision: str, training: bool
) -> None:
    """Refuses, before any data is read, a loaded model (in RAM) that the trainer's root ``device`` cannot
    hold at its ``precision``; not for sharding strategies, where each device holds only a share."""
    params = list(model.parameters())
    width = params[0].element_size() if params else 4
    width = {"16-true": 2, "bf16-true": 2, "64-true": 8}.get(precision, width)
    size = ModelSize(_count(model), width)
    held = size.needed(False) if device.type == "cpu" else 0
    check_fits(model.config, size, config_source(name), key, training, device, already_held=held)


def head_parameters(model: PreTrainedModel) -> dict[str, torch.nn.Parameter]:
    """The masked-LM head's own parameters by name: those outside the encoder (``base_model_prefix``); a
    decoder tied to the input embeddings is the encoder's, whichever name lists it."""
    prefix, embeddings = f"{model.base_model_prefix}.", model.get_input_embeddings().weight
    return {n: p for n, p in model.named_parameters() if not n.startswith(prefix) and p is not embeddings}


# What the masked-LM head of a loaded checkpoint is: the card and the before column say it.
HEAD_TRAINED, HEAD_UNTRAINED, HEAD_PARTIAL = "trained", "untrained", "partly trained"


def check_head(
    model: PreTrainedModel, missing_keys: Sequence[str], name: str, key: str, allow_partial: bool = False
) -> str:
    """What ``model``'s masked-LM head is, from the keys its checkpoint ``name`` lacked (transformers'
    loading report): :data:`HEAD_TRAINED`; :data:`HEAD_UNTRAINED` for an encoder-only checkpoint (one line
    says so); :data:`HEAD_PARTIAL` only with ``allow_partial``, else refused. A decoder that is not tied to
    the input embeddings although the config ties them is refused: it would predict from weights that are
    never trained (transformers 5 has shipped such a loading bug)."""
    output, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    tied = getattr(model.config.get_text_config(), "tie_word_embeddings", False)
    if tied and output is not None and output.weight is not embeddings.weight:
        raise MLMAdaptError(
            f"{key}: {name}: the masked-LM decoder is not tied to the input embeddings though its config "
            "sets tie_word_embeddings, so it would predict from weights that are never trained; load it with "
            "a transformers version that ties them"
        )
    head = set(head_parameters(model))
    missing = head & set(missing_keys)
    if not missing:
        return HEAD_TRAINED
    if missing == head:
        kind = ", ".join(model.config.architectures or []) or "no head"
        rank_zero_warn(
            f"{key}: {name} has no masked-LM head (an encoder-only checkpoint: {kind}): the head starts "
            "untrained; without model.head_warmup_steps the before column scores that head, not the encoder"
        )
        return HEAD_UNTRAINED
    if not allow_partial:
        raise MLMAdaptError(
            f"{key}: {name} holds only part of its masked-LM head (missing "
            f"{', '.join(sorted(missing)[:3])}): those weights would start random beside trained ones; give "
            "the complete checkpoint, or set model.allow_partial_head: true to train them"
        )
    untrained = ", ".join(sorted(missing))
    rank_zero_warn(f"{key}: {name}: part of the masked-LM head starts untrained ({untrained})")
    return HEAD_PARTIAL


def pretrained_masked_lm(
    name: str, key: str, training: bool = False, allow_partial_head: bool = False, **kwargs: Any
) -> tuple[PreTrainedModel, str]:
    """``AutoModelForMaskedLM.from_pretrained(name, **kwargs)`` without code, after :func:`check_masked_lm`
    (messages start with ``key``), and what its head is (:func:`check_head`). A ``ValueError`` other than a
    refused file is left to the caller (an architecture without an MLM head)."""
    check_local(name, key, check_config_dir, check_weight_files)
    config = kwargs.get("config") or pretrained_config(name, key)
    check_masked_lm(config, name, key, pretrained=True, training=training)
    try:
        model, report = AutoModelForMaskedLM.from_pretrained(
            name, trust_remote_code=TRUST_REMOTE_CODE, output_loading_info=True, **kwargs
        )
    except (OSError, ValueError) as exc:
        if isinstance(exc, ValueError) and "trust_remote_code" not in str(exc):
            raise
        raise MLMAdaptError(f"{key}: cannot load a masked LM from {name!r}: {safe_line(exc)}") from None
    return model, check_head(model, report["missing_keys"], name, key, allow_partial_head)


def load_masked_lm(
    model_name_or_path: str,
    pretrained: bool = True,
    attn_implementation: str | None = "sdpa",
    allow_partial_head: bool = False,
) -> tuple[PreTrainedModel, str | None]:
    """Loads a masked LM (random init from the config unless ``pretrained``) and what its head is
    (:func:`check_head`; ``None`` for a random init), refusing decoder and causal-LM checkpoints in one
    line; ``sdpa`` attention falls back to the default (with an info line) for a model class without it
    (DeBERTa-v2)."""
    key = "model.model_name_or_path"
    config = pretrained_config(model_name_or_path, key)
    architectures = config.architectures or []
    if getattr(config, "is_decoder", False) or any(a.endswith(_CAUSAL_SUFFIXES) for a in architectures):
        raise MLMAdaptError(
            f"{key}: {model_name_or_path!r} is a decoder/causal-LM checkpoint "
            f"({', '.join(architectures) or 'is_decoder=True'}); "
            "its loss shifts labels by one position. Use a masked-LM checkpoint (e.g. BertForMaskedLM)"
        )
    masked_lm_class = MODEL_FOR_MASKED_LM_MAPPING.get(type(config), None)
    if attn_implementation == "sdpa" and not getattr(masked_lm_class, "_supports_sdpa", True):
        rank_zero_info(
            f"model.attn_implementation: {config.model_type} has no SDPA attention; using its default instead"
        )
        attn_implementation = None
    # Without a GPU the whole training state lives in RAM; with one, the trainer's device is checked later
    # (before_fit), once it is known.
    training = not torch.cuda.is_available()
    try:
        if pretrained:
            kwargs = {"config": config, "attn_implementation": attn_implementation}
            return pretrained_masked_lm(model_name_or_path, key, training, allow_partial_head, **kwargs)
        check_masked_lm(config, model_name_or_path, key, pretrained=False, training=training)
        model = AutoModelForMaskedLM.from_config(
            config, attn_implementation=attn_implementation, trust_remote_code=TRUST_REMOTE_CODE
        )
        return model, None
    except ValueError as exc:
        if "Unrecognized configuration class" in str(exc):
            raise MLMAdaptError(
                f"{key}: {model_name_or_path!r} (model_type {config.model_type!r}) has no masked-LM head; "
                "mlm_adapt adapts BERT-family masked language models"
            ) from None
        raise


def position_limit(model: PreTrainedModel) -> tuple[int | None, str]:
    """The longest sequence ``model``'s position table can index, and how that was found: RoBERTa-style
    tables (with a ``padding_idx``) count from ``padding_idx + 1`` (514 rows hold 512 tokens); rotary or
    relative positions (ModernBERT, DeBERTa-v2) have no table: the config's nominal value."""
    nominal = getattr(model.config, "max_position_embeddings", None)
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    embeddings = getattr(base, "embeddings", None)
    table = getattr(embeddings, "position_embeddings", None)
    if not isinstance(table, torch.nn.Embedding):
        return nominal, "max_position_embeddings in its config"
    offset = getattr(embeddings, "padding_idx", None)
    if isinstance(offset, int) and not isinstance(offset, bool):
        return (
            table.num_embeddings - offset - 1,
            f"its position table has {table.num_embeddings} rows, positions start after padding_idx {offset}",
        )
    return table.num_embeddings, f"its position table has {table.num_embeddings} rows"


def extend_embeddings(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tokens: Sequence[str]
) -> list[str]:
    """Adds ``tokens`` to ``tokenizer`` (in place) and resizes ``model``, each new row the mean of its old
    pieces; returns the tokens actually added (those not already in the vocabulary)."""
    vocab = tokenizer.get_vocab()
    new = [t for t in tokens if t not in vocab]
    if not new:
        return new
    pieces = [tokenizer(t, add_special_tokens=False)["input_ids"] or [tokenizer.unk_token_id] for t in new]
    old_size = model.get_input_embeddings().weight.shape[0]
    extend_tokenizer(tokenizer, new)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    embeddings = model.get_input_embeddings().weight
    decoder = model.get_output_embeddings()
    bias = getattr(decoder, "bias", None) if decoder is not None else None
    with torch.no_grad():
        for row, ids in enumerate(pieces, start=old_size):
            embeddings[row] = embeddings[ids].mean(0)
            if bias is not None and bias.shape[0] > row:
                bias[row] = bias[ids].mean(0)
    model.tie_weights()
    return new


def enable_gradient_checkpointing(model: PreTrainedModel) -> None:
    """Turns on transformers' activation checkpointing, non-reentrant (the variant that composes with
    ``torch.compile``, DDP and FSDP and needs no ``requires_grad`` inputs); one line if unsupported."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise MLMAdaptError(
            f"model.gradient_checkpointing: {type(model).__name__} does not support it; set it to false"
        )
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
