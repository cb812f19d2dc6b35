"""Property tests of whole-word masking (hypothesis) plus statistics on real reviews."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.masking import WholeWordMaskCollator
from mlm_adapt.masking.collator import mix32
from mlm_adapt.text.alignment import tokenize_with_word_ids
from mlm_adapt.text.blocks import build_blocks
from mlm_adapt.text.segmentation import JiebaSegmenter
from mlm_adapt.text.tokenizer import ordinary_token_ids


def lowbias32_reference(x: int) -> int:
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=50))
def test_vectorized_hash_matches_python_reference(values):
    got = mix32(np.array(values, dtype=np.uint32)).tolist()
    assert got == [lowbias32_reference(v) for v in values]


def make_features(tokenizer, word_lengths_per_example, epoch=0, first_id=0):
    """Examples [CLS] words... [SEP] with ordinary token ids and compact word ids."""
    vocab = ordinary_token_ids(tokenizer)
    features = []
    for n, lengths in enumerate(word_lengths_per_example):
        ids, wids = [tokenizer.cls_token_id], [-1]
        for word, length in enumerate(lengths):
            ids += [vocab[(7 * word + i) % len(vocab)] for i in range(length)]
            wids += [word] * length
        ids.append(tokenizer.sep_token_id)
        wids.append(-1)
        features.append({"input_ids": ids, "word_ids": wids, "example_id": first_id + n, "epoch": epoch})
    return features


examples = st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=40), min_size=1, max_size=6)


@settings(max_examples=120, deadline=None)
@given(word_lengths=examples, epoch=st.integers(0, 1000), first_id=st.integers(0, 2**40))
def test_masks_whole_words_only_and_respects_specials_and_padding(tokenizer, word_lengths, epoch, first_id):
    collator = WholeWordMaskCollator(tokenizer)
    features = make_features(tokenizer, word_lengths, epoch, first_id)
    batch = collator(features)
    input_ids, labels, word_ids, attention = (
        batch["input_ids"],
        batch["labels"],
        batch["word_ids"],
        batch["attention_mask"],
    )
    assert input_ids.shape[1] % 8 == 0
    for row, feature in enumerate(features):
        n = len(feature["input_ids"])
        original = torch.tensor(feature["input_ids"])
        # attention: 1 on every real token ([MASK] included), 0 on padding only
        assert attention[row, :n].eq(1).all() and attention[row, n:].eq(0).all()
        assert input_ids[row, n:].eq(tokenizer.pad_token_id).all()
        # labels are the original ids where selected, -100 elsewhere; specials/pad never selected
        selected = labels[row] != -100
        assert not selected[0] and not selected[n - 1 :].any()
        assert labels[row, :n][selected[:n]].equal(original[selected[:n]])
        assert input_ids[row, :n][~selected[:n]].equal(original[~selected[:n]])
        # only whole words: every token of a word shares the word's fate
        for word in word_ids[row][word_ids[row] >= 0].unique():
            fate = selected[word_ids[row] == word]
            assert fate.all() or not fate.any()
        # the model sees [MASK] only where a label is set
        assert not (input_ids[row] == tokenizer.mask_token_id)[~selected].any()


@settings(max_examples=30, deadline=None)
@given(word_lengths=examples)
def test_random_replacements_are_ordinary_tokens(tokenizer, word_lengths):
    collator = WholeWordMaskCollator(tokenizer, mask_replace_prob=0.0, random_replace_prob=1.0)
    batch = collator(make_features(tokenizer, word_lengths))
    replaced = batch["input_ids"][batch["labels"] != -100]
    allowed = set(ordinary_token_ids(tokenizer))
    assert set(replaced.tolist()) <= allowed
    vocab = tokenizer.convert_ids_to_tokens(sorted(allowed))
    assert not any(t.startswith("##") or t in tokenizer.all_special_tokens for t in vocab)


@pytest.fixture(scope="module")
def review_blocks(tokenizer, review_texts):
    out = tokenize_with_word_ids(review_texts, tokenizer, JiebaSegmenter())
    blocks = build_blocks(
        out["input_ids"], out["word_ids"], 128, tokenizer.cls_token_id, tokenizer.sep_token_id, packing=True
    )
    return [
        {"input_ids": i, "word_ids": w, "example_id": n}
        for n, (i, w) in enumerate(zip(blocks["input_ids"], blocks["word_ids"], strict=True))
    ]


def test_rate_and_80_10_10_proportions_on_real_text(tokenizer, review_blocks):
    collator = WholeWordMaskCollator(tokenizer, mlm_probability=0.15)
    selected = masked = unchanged = maskable = 0
    for epoch in range(4):
        batch = collator([{**f, "epoch": epoch} for f in review_blocks])
        sel = batch["labels"] != -100
        maskable += int((batch["word_ids"] >= 0).sum())
        selected += int(sel.sum())
        masked += int((batch["input_ids"][sel] == tokenizer.mask_token_id).sum())
        unchanged += int((batch["input_ids"][sel] == batch["labels"][sel]).sum())
    assert maskable > 100_000
    assert selected / maskable == pytest.approx(0.15, abs=0.005)
    assert masked / selected == pytest.approx(0.8, abs=0.02)
    # kept (10%) plus random draws that happen to hit the original token (rare with ~1.5k tokens)
    assert unchanged / selected == pytest.approx(0.1, abs=0.02)


def test_expected_rate_is_exact_even_for_short_examples(tokenizer):
    """One 3-word, 5-token example: E[masked tokens] = 0.15 * 5 exactly under the crossing rule."""
    collator = WholeWordMaskCollator(tokenizer, mlm_probability=0.15)
    features = make_features(tokenizer, [[2, 1, 2]] * 4000)
    batch = collator(features)
    per_example = (batch["labels"] != -100).sum(1).float()
    assert per_example.mean().item() == pytest.approx(0.75, abs=0.05)


def test_masks_are_reproducible_new_each_epoch_and_fixed_for_validation(tokenizer, review_blocks):
    collator = WholeWordMaskCollator(tokenizer, seed=7)
    features = review_blocks[:16]
    first = collator(features)["labels"]
    assert collator(features)["labels"].equal(first)  # epoch 0 (validation) every time
    assert WholeWordMaskCollator(tokenizer, seed=7)(features)["labels"].equal(first)  # another process
    assert not collator([{**f, "epoch": 1} for f in features])["labels"].equal(first)
    assert not WholeWordMaskCollator(tokenizer, seed=8)(features)["labels"].equal(first)
    # independent of batch composition: an example gets the same mask alone or in a batch
    alone = collator(features[3:4])["labels"][0]
    assert alone[: len(features[3]["input_ids"])].equal(first[3, : len(features[3]["input_ids"])])


def test_collator_rejects_bad_settings(tokenizer):
    with pytest.raises(MLMAdaptError, match=r"data.masking.mlm_probability=1.5 must be in \(0, 1\)"):
        WholeWordMaskCollator(tokenizer, mlm_probability=1.5)
    with pytest.raises(MLMAdaptError, match="exceeds 1"):
        WholeWordMaskCollator(tokenizer, mask_replace_prob=0.9, random_replace_prob=0.2)


def test_collator_rejects_a_tokenizer_without_mask_token(tokenizer):
    import copy

    no_mask = copy.deepcopy(tokenizer)
    no_mask.mask_token = None
    with pytest.raises(MLMAdaptError, match="has no mask token"):
        WholeWordMaskCollator(no_mask)
