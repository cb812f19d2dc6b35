"""Around the encoder: the masked-only vocabulary projection, and attention within each document.

**Masked-only head.** The head costs ``hidden x vocab`` per position; projecting only the ~15% of positions
that are predicted saves most of it, with an identical loss. :func:`split_head` knows each family's encoder
and head (any other model gets the full logits, with one info line):

============================== ========================== ==================================================
family                         encoder                    head (applied to ``(N, hidden)`` rows)
============================== ========================== ==================================================
BERT, RoBERTa/XLM-R, MacBERT   ``bert``/``roberta``       ``cls`` / ``lm_head``
ALBERT                         ``albert``                 ``predictions``
DeBERTa-v2/v3 (legacy head)    ``deberta``                ``cls``
DeBERTa-v2/v3 (``legacy=False``) ``deberta``              ``lm_predictions(h, word_embeddings)``
ELECTRA generator              ``electra``                ``generator_lm_head(generator_predictions(h))``
ModernBERT                     ``model``                  ``decoder(head(h))``
============================== ========================== ==================================================

**Document attention** (``data.blocks.document_attention: true``). :func:`document_inputs` turns the
collator's ``document_ids`` (``-1`` on padding) and ``position_ids`` into a block-diagonal 4D mask (boolean
for SDPA,
additive for eager; transformers passes 4D masks through unchanged) and family-specific position ids, so a
document's logits are those of the document run alone:

========================= ================================================================================
family                    how
========================= ================================================================================
BERT, ELECTRA, ALBERT     4D mask; absolute positions restart at 0
RoBERTa, XLM-R            4D mask; positions restart at ``padding_idx + 1`` (what RoBERTa counts from)
ModernBERT                a 4D mask per layer type: global layers block-diagonal, local layers also
                          within the sliding window; rotary positions restart at 0
DeBERTa-v2/v3             refused: its embeddings and convolution read the 2D mask
others, FlashAttention-2  refused at setup with one line
========================= ================================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from transformers import PreTrainedModel

from mlm_adapt.errors import MLMAdaptError

# Heads that map hidden states of any leading shape to vocabulary logits, by attribute name.
_PLAIN_HEADS = ("cls", "lm_head", "predictions")


@dataclass
class HeadSplit:
    """A masked LM cut in two: the base model, the head from ``(N, hidden)`` states to ``(N, vocab)`` logits,
    and the modules that hold the computation (for in-place ``torch.compile``)."""

    encoder: nn.Module
    head: Callable[[torch.Tensor], torch.Tensor]
    modules: tuple[nn.Module, ...]

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **inputs: Any) -> torch.Tensor:
        """Last hidden states ``(B, L, hidden)``; ``inputs`` (e.g. ``position_ids``) go to the encoder."""
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask, **inputs)[0]


def split_head(model: PreTrainedModel) -> HeadSplit | None:
    """Splits ``model`` into encoder and head, or returns ``None`` (logged) when its head is not known."""
    encoder = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if not isinstance(encoder, nn.Module):
        return _unsupported(model, "no base model attribute")
    name = type(model).__name__
    if name.startswith("Electra"):
        predictions, projection = model.generator_predictions, model.generator_lm_head
        return HeadSplit(encoder, lambda h: projection(predictions(h)), (encoder, predictions, projection))
    if name.startswith("ModernBert"):
        if not isinstance(getattr(model, "decoder", None), nn.Module):
            return _unsupported(model, "no decoder")
        transform, decoder = model.head, model.decoder
        return HeadSplit(encoder, lambda h: decoder(transform(h)), (encoder, transform, decoder))
    if name.startswith("Deberta"):  # DebertaV2 too
        if getattr(model.config, "legacy", True):
            return HeadSplit(encoder, model.cls, (encoder, model.cls))
        head, embeddings = model.lm_predictions, encoder.embeddings.word_embeddings
        return HeadSplit(encoder, lambda h: head(h, embeddings), (encoder, head))
    for attribute in _PLAIN_HEADS:
        head = getattr(model, attribute, None)
        if isinstance(head, nn.Module):
            return HeadSplit(encoder, head, (encoder, head))
    return _unsupported(model, "unknown head")


def _unsupported(model: nn.Module, why: str) -> None:
    rank_zero_info(
        f"model.masked_only_head: {type(model).__name__} has an unknown masked-LM head ({why}); "
        "computing the full logits instead"
    )


SUPPORTED_FAMILIES = ("bert", "electra", "albert", "roberta", "xlm-roberta", "camembert", "modernbert")
KERNELS = ("sdpa", "eager")


def check_document_attention(model: PreTrainedModel) -> None:
    """Raises one line when ``model`` cannot keep attention within documents."""
    model_type = model.config.model_type
    if model_type not in SUPPORTED_FAMILIES:
        why = "its embeddings read the 2D padding mask" if model_type.startswith("deberta") else "not tested"
        raise MLMAdaptError(
            f"data.blocks.document_attention: {type(model).__name__} ({why}) cannot attend within documents; "
            f"set data.blocks.document_attention: false (supported: {', '.join(SUPPORTED_FAMILIES)})"
        )
    kernel = model.config._attn_implementation
    if kernel not in KERNELS:
        raise MLMAdaptError(
            f"data.blocks.document_attention needs model.attn_implementation sdpa or eager, not {kernel!r}"
        )


def _format(allowed: torch.Tensor, kernel: str, dtype: torch.dtype) -> torch.Tensor:
    """A boolean ``(B, L, L)`` pattern as the kernel's 4D mask: boolean (SDPA) or additive (eager)."""
    allowed = allowed[:, None]
    if kernel == "sdpa":
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )


def document_inputs(
    model: PreTrainedModel,
    attention_mask: torch.Tensor,
    document_ids: torch.Tensor,
    position_ids: torch.Tensor,
) -> dict[str, torch.Tensor | dict[str, torch.Tensor]]:
    """``attention_mask`` and ``position_ids`` keyword arguments for ``model`` (its family and kernel decide
    the format) that keep attention within documents; ``attention_mask`` is 1 on keys that may be attended
    (0 on padding or excluded ``[MASK]``), ``position_ids`` restart at 0 in every document."""
    # Padding attends to padding only: no row is empty (an all-masked row would turn into NaN).
    keys = attention_mask.bool() | (document_ids < 0)
    allowed = (document_ids[:, :, None] == document_ids[:, None, :]) & keys[:, None, :]
    kernel = model.config._attn_implementation
    dtype = next(model.parameters()).dtype
    embeddings = getattr(model.base_model, "embeddings", None)
    if hasattr(embeddings, "create_position_ids_from_input_ids"):  # RoBERTa-style: counts from pad + 1
        position_ids = position_ids + embeddings.padding_idx + 1
    mask = _format(allowed, kernel, dtype)
    if model.config.model_type == "modernbert":
        index = torch.arange(allowed.shape[-1], device=allowed.device)
        window = (index[:, None] - index[None, :]).abs() <= model.config.sliding_window
        mask = {"full_attention": mask, "sliding_attention": _format(allowed & window, kernel, dtype)}
    return {"attention_mask": mask, "position_ids": position_ids}
