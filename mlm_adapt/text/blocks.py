"""Cutting tokenized documents into model-sized blocks ``[CLS] doc [SEP] doc ... [SEP]``.

How a block edge meets a word: a block ends at the last word boundary that fits, so a word is never split
between two blocks and never half-masked. Only a single word longer than a whole block (a URL, a long
number) is cut, and each part is then masked as a word of its own. Inside one block the word ids are
compact (``0 .. n_words-1``, increasing along the block), so the collator can count word lengths with one
``scatter_add`` and needs no per-token Python.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mlm_adapt.text.tokens import SPECIAL_WORD_ID


def _block_ends(word_ids: np.ndarray, capacity: int) -> list[int]:
    """End offsets of consecutive blocks of at most ``capacity`` tokens, cut at word boundaries."""
    n = len(word_ids)
    # A cut at position p is clean when token p starts a new word (or is a separator).
    clean = np.flatnonzero((word_ids[1:] != word_ids[:-1]) | (word_ids[1:] == SPECIAL_WORD_ID)) + 1
    ends, start = [], 0
    while n - start > capacity:
        limit = start + capacity
        i = np.searchsorted(clean, limit, side="right") - 1
        end = int(clean[i]) if i >= 0 and clean[i] > start else limit  # a word longer than a block is cut
        ends.append(end)
        start = end
    ends.append(n)
    return ends


def _compact(word_ids: np.ndarray) -> np.ndarray:
    """Renumbers non-negative ids to 0..k-1 in order of appearance (ids are increasing along a stream)."""
    out = np.full(len(word_ids), SPECIAL_WORD_ID, dtype=np.int64)
    words = word_ids >= 0
    if words.any():
        _, out[words] = np.unique(word_ids[words], return_inverse=True)
    return out


def build_blocks(
    input_ids: Sequence[Sequence[int]],
    word_ids: Sequence[Sequence[int]],
    max_seq_length: int,
    cls_token_id: int,
    sep_token_id: int,
    packing: bool,
    document_delimiters: bool = False,
) -> dict[str, list[list[int]]]:
    """Turns tokenized documents into model inputs ``[CLS] ... [SEP]`` of at most ``max_seq_length``.

    Args:
        input_ids: Token ids per document (no special tokens).
        word_ids: Word id per token, as from :func:`tokenize_with_word_ids`.
        max_seq_length: Block size including ``[CLS]`` and ``[SEP]``.
        cls_token_id: Id that opens a block: the tokenizer's ``cls`` (``<s>`` for XLM-R), else its ``bos``
            (see :func:`mlm_adapt.text.vocabulary.block_special_ids`).
        sep_token_id: Id that closes a block and separates packed documents: ``sep``, else ``eos``.
        packing: Concatenate documents (``[SEP]`` between them) into full blocks; otherwise each document
            becomes its own block(s). Either way a document longer than a block continues in the next
            block: no text is dropped.
        document_delimiters: With ``packing``, every document gets its own ``[CLS] ... [SEP]``
            (``[CLS] d1 [SEP] [CLS] d2 [SEP]``), as it would alone: the form document attention needs.

    Returns:
        ``{"input_ids": [...], "word_ids": [...]}`` with compact word ids per block.
    """
    capacity = max_seq_length - 2
    if capacity < 1:
        raise ValueError(f"max_seq_length must be at least 3, got {max_seq_length}")
    streams: list[tuple[np.ndarray, np.ndarray]] = []
    separator = [sep_token_id, cls_token_id] if document_delimiters else [sep_token_id]
    if packing:
        ids_parts, wid_parts, offset = [], [], 0
        for ids, wids in zip(input_ids, word_ids, strict=True):
            if not ids:
                continue
            wids = np.asarray(wids, dtype=np.int64)
            # Offset ids so that words of different documents never share an id.
            words = np.where(wids >= 0, wids + offset, SPECIAL_WORD_ID)
            wid_parts += [words, [SPECIAL_WORD_ID] * len(separator)]
            ids_parts += [ids, separator]
            offset += int(wids.max()) + 1
        if ids_parts:
            # The trailing separator of the last document: the block adds its own [SEP].
            streams.append((np.concatenate(ids_parts[:-1]), np.concatenate(wid_parts[:-1])))
    else:
        streams = [
            (np.asarray(ids, dtype=np.int64), np.asarray(wids, dtype=np.int64))
            for ids, wids in zip(input_ids, word_ids, strict=True)
            if ids
        ]
    out_ids: list[list[int]] = []
    out_wids: list[list[int]] = []
    for ids, wids in streams:
        start = 0
        for end in _block_ends(wids, capacity):
            block_ids, block_wids = ids[start:end], wids[start:end]
            start = end
            # Document delimiters at a block edge would double up with the block's [CLS]/[SEP]; drop them.
            lo, hi = 0, len(block_ids)
            while lo < hi and block_wids[lo] == SPECIAL_WORD_ID and block_ids[lo] in separator:
                lo += 1
            while hi > lo and block_wids[hi - 1] == SPECIAL_WORD_ID and block_ids[hi - 1] in separator:
                hi -= 1
            block_ids, block_wids = block_ids[lo:hi], block_wids[lo:hi]
            if not len(block_ids):
                continue
            out_ids.append([cls_token_id, *block_ids.tolist(), sep_token_id])
            out_wids.append([SPECIAL_WORD_ID, *_compact(block_wids).tolist(), SPECIAL_WORD_ID])
    return {"input_ids": out_ids, "word_ids": out_wids}
