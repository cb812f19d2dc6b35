"""The fast whole-word masking is bit-identical to the plain torch formulation (kept here as the reference).

The reference visits words in the order of a stable ``argsort`` of their keys: ties broken by word index.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mlm_adapt.masking import WholeWordMaskCollator
from mlm_adapt.masking.collator import example_keys, whole_word_mask
from mlm_adapt.text.alignment import tokenize_with_word_ids
from mlm_adapt.text.blocks import build_blocks
from mlm_adapt.text.segmentation import JiebaSegmenter

_M32 = 0xFFFFFFFF


# ---- reference: the original int64-torch implementation, verbatim in behaviour -------------------------
def _ref_mul32(x, c):
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _M32


def _ref_mix32(x):
    x = x & _M32
    x = _ref_mul32(x ^ (x >> 16), 0x7FEB352D)
    x = _ref_mul32(x ^ (x >> 15), 0x846CA68B)
    return x ^ (x >> 16)


def ref_example_keys(seed, epoch, example_id):
    key = _ref_mix32(torch.full_like(example_id, seed & _M32) ^ _ref_mix32(epoch + 0x9E3779B9))
    key = _ref_mix32(key ^ (example_id & _M32))
    return _ref_mix32(key ^ (example_id >> 32))


def ref_uniform(keys, n, stream):
    positions = torch.arange(n, dtype=torch.int64)
    h = _ref_mix32(keys[:, None] ^ _ref_mix32(positions[None, :] * 4 + stream + 0x632BE5AB))
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


def ref_whole_word_mask(
    input_ids,
    word_ids,
    keys,
    *,
    mask_token_id,
    random_token_ids,
    special_token_ids,
    mlm_probability=0.15,
    mask_replace_prob=0.8,
    random_replace_prob=0.1,
):
    batch, length = input_ids.shape
    maskable = (word_ids >= 0) & ~torch.isin(input_ids, special_token_ids)
    word_index = word_ids.clamp(min=0)
    n_words = length
    word_len = torch.zeros(batch, n_words, dtype=torch.int64).scatter_add_(1, word_index, maskable.long())
    target = mlm_probability * word_len.sum(1, keepdim=True)
    order_key = ref_uniform(keys, n_words, 0).masked_fill(word_len == 0, 2.0)
    order = order_key.argsort(dim=1, stable=True)  # ties: lower word index first
    sorted_len = word_len.gather(1, order)
    covered_after = sorted_len.cumsum(1)
    covered_before = covered_after - sorted_len
    crossing_prob = (target - covered_before) / sorted_len.clamp(min=1)
    chosen_sorted = (covered_after <= target) | (
        (covered_before < target) & (ref_uniform(keys, n_words, 1) < crossing_prob)
    )
    chosen = torch.zeros_like(chosen_sorted).scatter_(1, order, chosen_sorted) & (word_len > 0)
    action = ref_uniform(keys, n_words, 2)
    to_mask_word = chosen & (action < mask_replace_prob)
    to_random_word = (
        chosen & (action >= mask_replace_prob) & (action < mask_replace_prob + random_replace_prob)
    )
    selected = chosen.gather(1, word_index) & maskable
    labels = torch.where(selected, input_ids, -100)
    random_tokens = random_token_ids[
        (ref_uniform(keys, length, 3) * len(random_token_ids)).long().clamp(max=len(random_token_ids) - 1)
    ]
    masked = torch.where(selected & to_mask_word.gather(1, word_index), mask_token_id, input_ids)
    masked = torch.where(selected & to_random_word.gather(1, word_index), random_tokens, masked)
    return masked, labels


def ref_pad(features, pad_token_id, multiple):
    lengths = [len(f["input_ids"]) for f in features]
    length = -(-max(lengths) // multiple) * multiple
    input_ids = torch.full((len(features), length), pad_token_id, dtype=torch.int64)
    word_ids = torch.full((len(features), length), -1, dtype=torch.int64)
    for row, (feature, n) in enumerate(zip(features, lengths, strict=True)):
        input_ids[row, :n] = torch.as_tensor(feature["input_ids"])
        word_ids[row, :n] = torch.as_tensor(feature["word_ids"])
    attention_mask = (torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": input_ids, "attention_mask": attention_mask, "word_ids": word_ids}


# ---- tests ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def block_features(review_texts, tokenizer):
    tokens = tokenize_with_word_ids(review_texts, tokenizer, JiebaSegmenter())
    feats = {}
    for packing, length in ((True, 512), (False, 128)):
        blocks = build_blocks(
            tokens["input_ids"],
            tokens["word_ids"],
            length,
            tokenizer.cls_token_id,
            tokenizer.sep_token_id,
            packing,
        )
        feats[packing] = [
            {
                "input_ids": np.asarray(i, dtype=np.int32),
                "word_ids": np.asarray(w, dtype=np.int32),
                "example_id": n,
                "epoch": 0,
            }
            for n, (i, w) in enumerate(zip(blocks["input_ids"], blocks["word_ids"], strict=True))
        ]
    return feats


def test_example_keys_match_reference():
    ids = torch.tensor([0, 1, 7, 2**31, 2**32 - 1, 2**32, 2**40 + 5, 123456789012], dtype=torch.int64)
    for seed in (0, 42, 2**33 + 3):
        for epoch in (0, 1, 17):
            epochs = torch.full_like(ids, epoch)
            assert torch.equal(example_keys(seed, epochs, ids), ref_example_keys(seed, epochs, ids))


@pytest.mark.parametrize("packing", [True, False])
def test_collator_bit_identical_to_reference(block_features, tokenizer, packing):
    collator = WholeWordMaskCollator(tokenizer, seed=3)
    features = block_features[packing]
    batch_size = 16 if packing else 64
    n_checked = 0
    for epoch in (0, 1, 2):
        for start in range(0, len(features), batch_size):
            chunk = [dict(f, epoch=epoch) for f in features[start : start + batch_size]]
            fast = collator(chunk)
            ref = ref_pad(chunk, collator.pad_token_id, collator.pad_to_multiple_of)
            assert torch.equal(fast["attention_mask"], ref["attention_mask"])
            assert torch.equal(fast["word_ids"], ref["word_ids"])
            masked, labels = ref_whole_word_mask(
                ref["input_ids"],
                ref["word_ids"],
                collator.keys(chunk),
                mask_token_id=collator.mask_token_id,
                random_token_ids=collator.random_token_ids,
                special_token_ids=collator.special_token_ids,
            )
            assert torch.equal(fast["input_ids"], masked)
            assert torch.equal(fast["labels"], labels)
            n_checked += len(chunk)
    assert n_checked >= 3 * len(features)


def test_tied_order_keys_end_to_end(tokenizer):
    """One word per token (~0.12 tied key pairs per row): ties go by word index, as in the reference."""
    collator = WholeWordMaskCollator(tokenizer)
    batch, length = 24, 2048
    generator = torch.Generator().manual_seed(0)
    input_ids = collator.random_token_ids[
        torch.randint(len(collator.random_token_ids), (batch, length), generator=generator)
    ]
    word_ids = torch.arange(length).repeat(batch, 1)
    word_ids[:, -5:] = -1  # some specials/padding
    keys = example_keys(0, torch.zeros(batch, dtype=torch.int64), torch.arange(batch))
    kwargs = dict(
        mask_token_id=collator.mask_token_id,
        random_token_ids=collator.random_token_ids,
        special_token_ids=collator.special_token_ids,
        mlm_probability=0.4,
    )
    fast = whole_word_mask(input_ids, word_ids, keys, **kwargs)
    ref = ref_whole_word_mask(input_ids, word_ids, keys, **kwargs)
    assert torch.equal(fast[0], ref[0]) and torch.equal(fast[1], ref[1])
