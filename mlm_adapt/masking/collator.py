"""The ``collate_fn`` of every mlm_adapt DataLoader: pad a batch, then mask whole units of it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, get_args

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.masking.hashing import example_keys
from mlm_adapt.masking.sampler import MaskingScheme, check_probabilities, masking_units, whole_word_mask
from mlm_adapt.text.tokenizer import block_special_ids, ordinary_token_ids


class WholeWordMaskCollator:
    """Pads examples and masks whole words; the ``collate_fn`` of every mlm_adapt DataLoader.

    Args:
        tokenizer: The model's tokenizer (needs a mask token).
        mlm_probability: Expected fraction of maskable tokens to predict; an example carrying a
            ``mask_rate`` (set by a masking-rate schedule) is masked at that rate instead.
        mask_replace_prob: Fraction of selected words replaced by ``[MASK]``.
        random_replace_prob: Fraction of selected words replaced by random ordinary tokens.
        pad_to_multiple_of: Pad the batch length up to a multiple of this (tensor-core friendly); 1 for none.
        seed: Seed of the masking hash.
        masking: Masking unit: ``whole_word`` (jieba words), ``ngram`` (spans of 1-4 words) or ``token``
            (single tokens, the character-masking ablation); see :mod:`mlm_adapt.masking.sampler`. The batch's
            ``word_ids`` stay the jieba word ids whatever the unit.
        document_attention: Add ``document_ids`` (``-1`` on padding) and ``position_ids`` restarting at
            every document's opening ``[CLS]`` (blocks built with ``document_delimiters``), for attention
            within each document.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        mlm_probability: float = 0.15,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
        pad_to_multiple_of: int = 8,
        seed: int = 0,
        masking: MaskingScheme = "whole_word",
        document_attention: bool = False,
    ):
        if tokenizer.mask_token_id is None:
            raise MLMAdaptError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no mask token; "
                "masked-LM adaptation needs a BERT-style tokenizer with [MASK]"
            )
        check_probabilities(mlm_probability, mask_replace_prob, random_replace_prob)
        if masking not in get_args(MaskingScheme):
            raise MLMAdaptError(
                f"data.masking={masking!r} is not a masking scheme; "
                f"use one of {', '.join(get_args(MaskingScheme))}"
            )
        self.mask_token_id = tokenizer.mask_token_id
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.random_token_ids = torch.tensor(ordinary_token_ids(tokenizer), dtype=torch.int64)
        self.special_token_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.int64)
        # A per-id table: one gather instead of torch.isin over the batch. Ids past the tokenizer (which no
        # embedding could look up either) are clipped onto the last entry rather than raising here.
        self.is_special = np.zeros(max(len(tokenizer), int(self.special_token_ids.max()) + 1), dtype=bool)
        self.is_special[self.special_token_ids.numpy()] = True
        self.mlm_probability = mlm_probability
        self.mask_replace_prob = mask_replace_prob
        self.random_replace_prob = random_replace_prob
        self.pad_to_multiple_of = max(1, pad_to_multiple_of)
        self.seed = seed
        self.masking = masking
        self.document_attention = document_attention
        self.block_start_id = block_special_ids(tokenizer)[0] if document_attention else None
        self._unkeyed_calls = 0

    def pad(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Pads ``input_ids``/``word_ids`` to a common length; ``attention_mask`` is 0 on padding only."""
        lengths = np.fromiter((len(f["input_ids"]) for f in features), dtype=np.int64, count=len(features))
        multiple = self.pad_to_multiple_of
        length = -(-int(lengths.max()) // multiple) * multiple
        # One boolean-mask assignment fills the rows in order: no per-row tensor copies.
        real = np.arange(length)[None, :] < lengths[:, None]
        input_ids = np.full((len(features), length), self.pad_token_id, dtype=np.int64)
        word_ids = np.full((len(features), length), -1, dtype=np.int64)
        input_ids[real] = np.concatenate([np.asarray(f["input_ids"]) for f in features])
        word_ids[real] = np.concatenate([np.asarray(f["word_ids"]) for f in features])
        return {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(real.astype(np.int64)),
            "word_ids": torch.from_numpy(word_ids),
        }

    def keys(self, features: Sequence[dict[str, Any]]) -> torch.Tensor:
        """Per-example masking keys; examples without an ``example_id`` get a running call counter."""
        if all("example_id" in f for f in features):
            example_id = torch.tensor([int(f["example_id"]) for f in features], dtype=torch.int64)
        else:
            start = self._unkeyed_calls
            self._unkeyed_calls += len(features)
            example_id = torch.arange(start, start + len(features), dtype=torch.int64)
        epoch = torch.tensor([int(f.get("epoch", 0)) for f in features], dtype=torch.int64)
        return example_keys(self.seed, epoch, example_id)

    def documents(
        self, input_ids: torch.Tensor, word_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """``document_ids`` and restarting ``position_ids`` of packed blocks (before masking: a ``[CLS]``
        is never masked, and only a special token has word id -1)."""
        starts = (input_ids == self.block_start_id) & (word_ids < 0)
        document_ids = torch.where(attention_mask.bool(), starts.long().cumsum(1) - 1, -1)
        positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        start_of = torch.where(starts, positions, 0).cummax(1).values
        position_ids = torch.where(document_ids >= 0, positions - start_of, 0)
        return {"document_ids": document_ids, "position_ids": position_ids}

    def rates(self, features: Sequence[dict[str, Any]]) -> float | torch.Tensor:
        """The masking rate: ``mlm_probability``, or a ``(B, 1)`` tensor of the examples' ``mask_rate``."""
        if not any("mask_rate" in f for f in features):
            return self.mlm_probability
        rates = [float(f.get("mask_rate", self.mlm_probability)) for f in features]
        return torch.tensor(rates, dtype=torch.float32)[:, None]

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Collates examples with ``input_ids`` and ``word_ids`` (optionally ``example_id``, ``epoch``,
        ``mask_rate``); ``maskable_tokens`` counts each row's tokens that could have been masked (the
        denominator of the realized masking rate); ``example_keys`` are the rows' masking keys, which also
        decide general-text replay (:mod:`mlm_adapt.data.replay`)."""
        batch = self.pad(features)
        keys = self.keys(features)
        special = np.take(self.is_special, batch["input_ids"].numpy(), mode="clip")
        maskable = (batch["word_ids"] >= 0) & ~torch.from_numpy(special)
        batch["maskable_tokens"] = maskable.sum(1)
        batch["example_keys"] = keys
        if self.document_attention:
            batch.update(self.documents(batch["input_ids"], batch["word_ids"], batch["attention_mask"]))
        batch["input_ids"], batch["labels"] = whole_word_mask(
            batch["input_ids"],
            masking_units(batch["word_ids"], keys, self.masking),
            keys,
            mask_token_id=self.mask_token_id,
            random_token_ids=self.random_token_ids,
            special_token_ids=self.special_token_ids,
            mlm_probability=self.rates(features),
            mask_replace_prob=self.mask_replace_prob,
            random_replace_prob=self.random_replace_prob,
            maskable=maskable,
        )
        return batch
