"""Loading a masked LM: refuse decoder checkpoints, split off its vocabulary head, add new tokens."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForMaskedLM, PreTrainedModel, PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError, check_model_path
from mlm_adapt.text.tokenizer import extend_tokenizer

# Attribute names of the vocabulary-projection head in Hugging Face masked-LM classes (BERT, RoBERTa/XLM-R,
# ALBERT, DeBERTa-v2). The head maps hidden states of any leading shape, so it can run on masked rows only.
_HEAD_NAMES = ("cls", "lm_head", "predictions", "lm_predictions")
_CAUSAL_SUFFIXES = ("LMHeadModel", "ForCausalLM")


def load_masked_lm(
    model_name_or_path: str, pretrained: bool = True, attn_implementation: str | None = "sdpa"
) -> PreTrainedModel:
    """Loads a masked-LM, refusing decoder and causal-LM checkpoints with a one-line reason.

    Args:
        model_name_or_path: Hub name or local directory.
        pretrained: Load the weights (``False``: random init from the config, i.e. pretraining from scratch).
        attn_implementation: ``sdpa``, ``eager`` or ``None`` for the library default.
    """
    key = "model.model_name_or_path"
    check_model_path(model_name_or_path, key)
    try:
        config = AutoConfig.from_pretrained(model_name_or_path)
    except Exception as exc:
        raise MLMAdaptError(f"{key}: cannot load a model config from {model_name_or_path!r}: {exc}") from exc
    architectures = config.architectures or []
    if getattr(config, "is_decoder", False) or any(a.endswith(_CAUSAL_SUFFIXES) for a in architectures):
        raise MLMAdaptError(
            f"{key}: {model_name_or_path!r} is a decoder/causal-LM checkpoint "
            f"({', '.join(architectures) or 'is_decoder=True'}); "
            "its loss shifts labels by one position. Use a masked-LM checkpoint (e.g. BertForMaskedLM)"
        )
    try:
        if pretrained:
            return AutoModelForMaskedLM.from_pretrained(
                model_name_or_path, config=config, attn_implementation=attn_implementation
            )
        return AutoModelForMaskedLM.from_config(config, attn_implementation=attn_implementation)
    except ValueError as exc:
        if "Unrecognized configuration class" in str(exc):
            raise MLMAdaptError(
                f"{key}: {model_name_or_path!r} (model_type {config.model_type!r}) has no masked-LM head; "
                "mlm_adapt adapts BERT-family masked language models"
            ) from None
        raise


def split_head(model: PreTrainedModel) -> tuple[nn.Module, nn.Module] | None:
    """``(encoder, vocabulary head)`` of a masked LM, or ``None`` when its head is not known."""
    encoder = getattr(model, model.base_model_prefix, None)
    for name in _HEAD_NAMES:
        head = getattr(model, name, None)
        if isinstance(head, nn.Module) and encoder is not None:
            return encoder, head
    return None


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
