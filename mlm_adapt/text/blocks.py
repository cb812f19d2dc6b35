"""Cutting tokenized documents into model-sized blocks ``[CLS] doc [SEP] doc ... [SEP]``.

A block ends at the last word boundary that fits, so a word is never split between two blocks and never
half-masked; only a word longer than a whole block (a URL, a long number) is cut, each part then masked as
a word of its own. Inside a block the word ids are compact (``0 .. n_words-1``, increasing), so the
collator counts word lengths with one ``scatter_add``.

:func:`pack_blocks` works on a whole batch with array operations: tokens and unit ids come in flat (from
:func:`mlm_adapt.text.alignment.tokenize_flat`), blocks go out flat with their offsets, ready to become
Arrow list columns. Only the choice of each block's end is a loop, one step per block of a long stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mlm_adapt.text.alignment import flatten

# The word id of special tokens and padding: never part of a masking unit.
SPECIAL_WORD_ID = -1


@dataclass
class PackedBlocks:
    """Blocks of a batch, flat: block ``b`` is ``ids[offsets[b]:offsets[b + 1]]`` (specials included)."""

    ids: np.ndarray
    word_ids: np.ndarray
    offsets: np.ndarray

    def to_lists(self) -> dict[str, list[list[int]]]:
        """``{"input_ids": [...], "word_ids": [...]}``, one Python list per block."""
        bounds = self.offsets.tolist()
        ids, wids = self.ids.tolist(), self.word_ids.tolist()
        pairs = list(zip(bounds[:-1], bounds[1:], strict=True))
        return {"input_ids": [ids[b:e] for b, e in pairs], "word_ids": [wids[b:e] for b, e in pairs]}


def _narrow(values: Sequence[int] | np.ndarray) -> np.ndarray:
    """``values`` as ``int32`` when they fit (half the memory traffic of ``int64``), else as ``int64``."""
    values = np.asarray(values)
    if values.size == 0 or values.dtype == np.int32:
        return values.astype(np.int32, copy=False)
    wide, limits = values.astype(np.int64, copy=False), np.iinfo(np.int32)
    return wide.astype(np.int32) if limits.min <= wide.min() and wide.max() <= limits.max else wide


def _block_bounds(
    word_ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, capacity: int
) -> tuple[np.ndarray, np.ndarray]:
    """Start and end offsets of the blocks of each stream ``[starts[i], ends[i])``, cut greedily: each block
    ends at the last word boundary that leaves it at most ``capacity`` tokens (inside a longer word only)."""
    short = ends - starts <= capacity
    block_starts, block_ends = [starts[short]], [ends[short]]
    long_streams = np.flatnonzero(~short)
    if len(long_streams):
        # A cut at position p is clean when token p starts a new word (or is a separator).
        clean = np.flatnonzero((word_ids[1:] != word_ids[:-1]) | (word_ids[1:] == SPECIAL_WORD_ID)) + 1
        cut_starts, cut_ends = [], []
        for stream in long_streams.tolist():
            start, end = int(starts[stream]), int(ends[stream])
            while end - start > capacity:
                limit = start + capacity
                i = int(clean.searchsorted(limit, side="right")) - 1
                cut = int(clean[i]) if i >= 0 and clean[i] > start else limit  # a word longer than a block
                cut_starts.append(start)
                cut_ends.append(cut)
                start = cut
            cut_starts.append(start)
            cut_ends.append(end)
        block_starts.append(np.asarray(cut_starts, dtype=np.int64))
        block_ends.append(np.asarray(cut_ends, dtype=np.int64))
    lo, hi = np.concatenate(block_starts), np.concatenate(block_ends)
    order = np.argsort(lo, kind="stable")  # blocks in stream order
    return lo[order], hi[order]


def _compact(words: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Word ids of blocks ``[-1, w..., -1]`` renumbered ``0..k-1`` inside each block, in increasing order."""
    is_word = words >= 0
    inner = words[is_word]
    if len(inner) > 1 and np.any(inner[1:] < inner[:-1]):
        return _compact_by_sorting(words, offsets)
    # Increasing ids: a word starts where the id changes ([CLS]/[SEP] between blocks restart the count).
    new = is_word.copy()
    new[1:] &= words[1:] != words[:-1]
    count = np.cumsum(new)
    # The count at each block's [CLS] is the number of words before the block.
    before = np.repeat(count[offsets[:-1]], np.diff(offsets))
    return np.where(is_word, count - before - 1, SPECIAL_WORD_ID)


def _compact_by_sorting(words: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """:func:`_compact` for ids in any order: the rank of each id among the distinct ids of its block."""
    block_of = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    is_word = words >= 0
    w, b = words[is_word], block_of[is_word]
    order = np.lexsort((w, b))
    ws, bs = w[order], b[order]
    new = np.ones(len(ws), dtype=bool)
    new[1:] = (ws[1:] != ws[:-1]) | (bs[1:] != bs[:-1])
    ranks = np.cumsum(new) - 1
    compact = np.empty(len(w), dtype=np.int64)
    compact[order] = ranks - ranks[np.searchsorted(bs, bs, side="left")]
    out = np.full(len(words), SPECIAL_WORD_ID, dtype=np.int64)
    out[is_word] = compact
    return out


def pack_blocks(
    ids: np.ndarray,
    units: np.ndarray,
    counts: np.ndarray,
    max_seq_length: int,
    cls_token_id: int,
    sep_token_id: int,
    packing: bool,
    document_delimiters: bool = False,
) -> PackedBlocks:
    """Turns a batch of tokenized documents into blocks ``[CLS] ... [SEP]`` of at most ``max_seq_length``.

    ``ids`` and ``units`` are the flat tokens and unit ids of :func:`~mlm_adapt.text.alignment.tokenize_flat`
    (no special tokens; units distinct between documents, increasing), ``counts`` the tokens per document
    (documents without tokens are skipped). ``cls_token_id`` opens a block and ``sep_token_id`` closes it
    and separates packed documents (:func:`mlm_adapt.text.tokenizer.block_special_ids`).

    ``packing`` concatenates documents (``[SEP]`` between them) into full blocks, else each document becomes
    its own block(s); either way a document longer than a block continues in the next one: no text is
    dropped. With ``document_delimiters`` every packed document gets its own ``[CLS] ... [SEP]``, as it
    would alone: the form document attention needs.
    """
    capacity = max_seq_length - 2
    if capacity < 1:
        raise ValueError(f"max_seq_length must be at least 3, got {max_seq_length}")
    ids, units = _narrow(ids), _narrow(units)
    counts = np.asarray(counts, dtype=np.int64)
    present = counts[counts > 0]
    doc_end = np.cumsum(present)
    if packing and len(present):
        separator = [sep_token_id, cls_token_id] if document_delimiters else [sep_token_id]
        # The separator goes in front of every document after the first.
        at = np.repeat(doc_end[:-1], len(separator))
        stream_ids = np.insert(ids, at, np.tile(np.asarray(separator, dtype=ids.dtype), len(present) - 1))
        stream_words = np.insert(units, at, SPECIAL_WORD_ID)
        starts, ends = np.zeros(1, dtype=np.int64), np.full(1, len(stream_ids), dtype=np.int64)
    else:
        stream_ids, stream_words = ids, units
        starts, ends = doc_end - present, doc_end
    lo, hi = _block_bounds(stream_words, starts, ends, capacity)
    # Document separators at a block edge would double up with the block's [CLS]/[SEP]; drop them.
    separator_at = np.append(stream_words == SPECIAL_WORD_ID, False)
    while (step := (lo < hi) & separator_at[lo]).any():
        lo = lo + step
    while (step := (hi > lo) & separator_at[np.maximum(hi - 1, 0)]).any():
        hi = hi - step
    kept = hi > lo
    lo, hi = lo[kept], hi[kept]
    inner = hi - lo
    offsets = np.zeros(len(inner) + 1, dtype=np.int64)
    np.cumsum(inner + 2, out=offsets[1:])
    # One gather builds every block: output position t of block b holds stream position
    # t - offsets[b] - 1 + lo[b]; its first and last positions are then overwritten by [CLS] and [SEP]. The
    # separators dropped at block edges are simply never gathered.
    index = np.arange(offsets[-1], dtype=np.int64) + np.repeat(lo - offsets[:-1] - 1, inner + 2)
    out_ids, out_words = stream_ids.take(index, mode="clip"), stream_words.take(index, mode="clip")
    first, last = offsets[:-1], offsets[1:] - 1
    out_ids[first], out_ids[last] = cls_token_id, sep_token_id
    out_words[first], out_words[last] = SPECIAL_WORD_ID, SPECIAL_WORD_ID
    return PackedBlocks(out_ids, _compact(out_words, offsets), offsets)


def build_blocks(
    input_ids: Sequence[Sequence[int]],
    word_ids: Sequence[Sequence[int]],
    max_seq_length: int,
    cls_token_id: int,
    sep_token_id: int,
    packing: bool,
    document_delimiters: bool = False,
) -> dict[str, list[list[int]]]:
    """:func:`pack_blocks` for per-document lists, as
    :func:`~mlm_adapt.text.alignment.tokenize_with_word_ids` gives them.

    ``input_ids`` are the token ids per document (no special tokens), ``word_ids`` their word ids (``>= 0``,
    increasing along each document); the other arguments are :func:`pack_blocks`'. Returns
    ``{"input_ids": [...], "word_ids": [...]}`` with compact word ids per block.
    """
    ids, counts = flatten(input_ids)
    words = flatten(word_ids)[0]
    present = counts > 0
    if present.any():
        # Offset each document's ids past the previous document's, so no two documents share an id.
        top = np.full(len(counts), -1, dtype=np.int64)
        top[present] = np.maximum.reduceat(words, (np.cumsum(counts) - counts)[present])
        span = top + 1
        offset = np.cumsum(span) - span
        words = np.where(words >= 0, words + np.repeat(offset, counts), SPECIAL_WORD_ID)
    packed = pack_blocks(
        ids, words, counts, max_seq_length, cls_token_id, sep_token_id, packing, document_delimiters
    )
    return packed.to_lists()


@dataclass(kw_only=True, frozen=True)
class BlockOptions:
    """How documents become blocks and batches (``data.blocks``; docs/recipe.md).

    Args:
        packing: Concatenate documents into full ``max_seq_length`` blocks (no padding waste). With
            ``false``, each line is its own example; a line longer than a block continues in the next one.
        document_attention: With ``packing``, every document in a block gets its own ``[CLS]``/``[SEP]``,
            restarting positions, and attends only to itself; the model must support it (BERT,
            RoBERTa/XLM-R, ELECTRA, ALBERT, ModernBERT) or setup refuses. See docs/recipe.md.
        group_by_length: With ``packing: false``, batch lines of similar length together (mega-batches of
            50 batches sorted by length), which removes most padding; every example keeps its masks.

    Batches are padded to a multiple of 8 tokens (tensor-core friendly), as Hugging Face's ``run_mlm`` does.
    """

    packing: bool = True
    document_attention: bool = False
    group_by_length: bool = True

    def check(self) -> BlockOptions:
        """Every combination is valid (``document_attention`` without ``packing`` separates nothing);
        returns the options."""
        return self
