"""Loading a masked LM: refuse decoder checkpoints, add new tokens (the head split is in ``heads``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from lightning.pytorch.utilities import rank_zero_info
from transformers import AutoModelForMaskedLM, PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.model_size import check_masked_lm
from mlm_adapt.guard.pretrained import TRUST_REMOTE_CODE, pretrained_config, pretrained_masked_lm
from mlm_adapt.text.tokenizer import extend_tokenizer

_CAUSAL_SUFFIXES = ("LMHeadModel", "ForCausalLM")


def load_masked_lm(
    model_name_or_path: str, pretrained: bool = True, attn_implementation: str | None = "sdpa"
) -> PreTrainedModel:
    """Loads a masked-LM, refusing decoder and causal-LM checkpoints with a one-line reason.

    Before anything is allocated, its size is checked against the free RAM (the whole training state when
    no GPU is visible, else the parameters) and a local directory's weights against its ``config.json``.

    Args:
        model_name_or_path: Hub name or local directory.
        pretrained: Load the weights (``False``: random init from the config, i.e. pretraining from scratch).
        attn_implementation: ``sdpa``, ``eager`` or ``None`` for the library default; ``sdpa`` falls back to
            the default (with an info line) for a model class without SDPA support (DeBERTa-v2).
    """
    key = "model.model_name_or_path"
    config = pretrained_config(model_name_or_path, key)
    architectures = config.architectures or []
    if getattr(config, "is_decoder", False) or any(a.endswith(_CAUSAL_SUFFIXES) for a in architectures):
        raise MLMAdaptError(
            f"{key}: {model_name_or_path!r} is a decoder/causal-LM checkpoint "
            f"({', '.join(architectures) or 'is_decoder=True'}); "
            "its loss shifts labels by one position. Use a masked-LM checkpoint (e.g. BertForMaskedLM)"
        )
    if attn_implementation == "sdpa" and not getattr(
        MODEL_FOR_MASKED_LM_MAPPING.get(type(config), None), "_supports_sdpa", True
    ):
        # DeBERTa-v2/v3 has no SDPA kernel in transformers: its own (eager) attention is the only one.
        rank_zero_info(
            f"model.attn_implementation: {config.model_type} has no SDPA attention; using its default instead"
        )
        attn_implementation = None
    # Without a GPU the whole training state lives in RAM; with one, the trainer's device is checked later
    # (before_fit), once it is known.
    training = not torch.cuda.is_available()
    try:
        if pretrained:
            return pretrained_masked_lm(
                model_name_or_path,
                key,
                training=training,
                config=config,
                attn_implementation=attn_implementation,
            )
        check_masked_lm(config, model_name_or_path, key, pretrained=False, training=training)
        return AutoModelForMaskedLM.from_config(
            config, attn_implementation=attn_implementation, trust_remote_code=TRUST_REMOTE_CODE
        )
    except ValueError as exc:
        if "Unrecognized configuration class" in str(exc):
            raise MLMAdaptError(
                f"{key}: {model_name_or_path!r} (model_type {config.model_type!r}) has no masked-LM head; "
                "mlm_adapt adapts BERT-family masked language models"
            ) from None
        raise


def position_limit(model: PreTrainedModel) -> tuple[int | None, str]:
    """The longest sequence ``model``'s own position table can index, and how that was found.

    BERT-style tables index positions ``0..rows-1``; RoBERTa-style ones (XLM-R, CamemBERT: embeddings with a
    ``padding_idx``) number positions from ``padding_idx + 1``, so ``max_position_embeddings`` 514 holds 512
    tokens. Rotary or relative positions (ModernBERT, DeBERTa-v2) have no table: the config's nominal value.
    """
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
    """Extends ``tokenizer`` (in place) and resizes ``model``, each new row the mean of its old pieces.

    Args:
        model: A masked-LM whose vocabulary matches ``tokenizer``.
        tokenizer: Its tokenizer, before the new tokens are added.
        tokens: Tokens to add.

    Returns:
        The tokens actually added (those not already in the vocabulary).
    """
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
