"""Attention within each document of a packed block (``data.document_attention: true``).

The collator gives every token a ``document_ids`` entry (``-1`` on padding) and ``position_ids`` restarting
at each document's ``[CLS]``; here they become what the model's attention interface takes: a block-diagonal
4D mask (boolean for SDPA, additive for eager attention; transformers passes 4D masks through unchanged)
and family-specific position ids. A document then sees exactly what it would see alone, so its logits are
those of the document run alone.

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

import torch
from transformers import PreTrainedModel

from mlm_adapt.errors import MLMAdaptError

SUPPORTED_FAMILIES = ("bert", "electra", "albert", "roberta", "xlm-roberta", "camembert", "modernbert")
KERNELS = ("sdpa", "eager")


def check_document_attention(model: PreTrainedModel) -> None:
    """Raises one line when ``model`` cannot keep attention within documents."""
    model_type = model.config.model_type
    if model_type not in SUPPORTED_FAMILIES:
        why = "its embeddings read the 2D padding mask" if model_type.startswith("deberta") else "not tested"
        raise MLMAdaptError(
            f"data.document_attention: {type(model).__name__} ({why}) cannot attend within documents; "
            f"set data.document_attention: false (supported: {', '.join(SUPPORTED_FAMILIES)})"
        )
    kernel = model.config._attn_implementation
    if kernel not in KERNELS:
        raise MLMAdaptError(
            f"data.document_attention needs model.attn_implementation sdpa or eager, not {kernel!r}"
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
    """``attention_mask`` and ``position_ids`` keyword arguments that keep attention within documents.

    Args:
        model: The masked LM (its family and attention kernel decide the format).
        attention_mask: ``(B, L)``, 1 on keys that may be attended (0 on padding, or on excluded ``[MASK]``).
        document_ids: ``(B, L)`` document index of each token, ``-1`` on padding.
        position_ids: ``(B, L)`` positions restarting at 0 in every document.
    """
    # Padding attends to padding only: no row is empty (an all-masked row would turn into NaN).
    keys = attention_mask.bool() | (document_ids < 0)
    allowed = (document_ids[:, :, None] == document_ids[:, None, :]) & keys[:, None, :]
    kernel = model.config._attn_implementation
    dtype = next(model.parameters()).dtype
    embeddings = getattr(model.base_model, "embeddings", None)
    if hasattr(embeddings, "create_position_ids_from_input_ids"):  # RoBERTa-style: counts from pad + 1
        position_ids = position_ids + embeddings.padding_idx + 1
    if model.config.model_type == "modernbert":
        index = torch.arange(allowed.shape[-1], device=allowed.device)
        window = (index[:, None] - index[None, :]).abs() <= model.config.sliding_window
        mask = {
            "full_attention": _format(allowed, kernel, dtype),
            "sliding_attention": _format(allowed & window, kernel, dtype),
        }
        return {"attention_mask": mask, "position_ids": position_ids}
    return {"attention_mask": _format(allowed, kernel, dtype), "position_ids": position_ids}
