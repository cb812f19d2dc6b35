"""The masked-only vocabulary projection: the encoder runs on the batch, the head on masked rows only.

The head (transform + vocabulary projection) costs ``hidden x vocab`` per position; only ~15% of positions are
predicted, so projecting just those saves most of it with an identical loss. Each family names its encoder
and head differently, and some heads take extra inputs; :func:`split_head` knows them:

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

Any other model falls back to the full logits (with one info line): correct, only slower.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from transformers import PreTrainedModel

# Heads that map hidden states of any leading shape to vocabulary logits, by attribute name.
_PLAIN_HEADS = ("cls", "lm_head", "predictions")


@dataclass
class HeadSplit:
    """A masked LM cut in two.

    Attributes:
        encoder: The base model; ``encoder(input_ids=..., attention_mask=...)[0]`` is ``(B, L, hidden)``.
        head: Maps ``(N, hidden)`` hidden states to ``(N, vocab)`` logits.
        modules: The modules that hold the computation (for in-place ``torch.compile``).
    """

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
    if name.startswith("DebertaV2") or name.startswith("Deberta"):
        if getattr(model.config, "legacy", True):
            head = model.cls
            return HeadSplit(encoder, head, (encoder, head))
        head = model.lm_predictions
        embeddings = encoder.embeddings.word_embeddings
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
    return None
