"""Masking units (n-gram and token masking) and the collator's ``masking`` switch."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlm_adapt.masking import WholeWordMaskCollator
from mlm_adapt.masking.collator import (
    NGRAM_PROBABILITIES,
    example_keys,
    masking_units,
    ngram_units,
    token_units,
)


def _word_rows(draw_lengths: list[list[int]], pad_to: int) -> torch.Tensor:
    """``[CLS] w0 w0 w1 ... [SEP] pad`` rows of compact word ids from lists of word lengths (in tokens)."""
    rows = []
    for lengths in draw_lengths:
        ids = [-1] + [w for w, n in enumerate(lengths) for _ in range(n)] + [-1]
        rows.append(ids + [-1] * (pad_to - len(ids)))
    return torch.tensor(rows)


word_lengths = st.lists(st.lists(st.integers(1, 4), min_size=0, max_size=20), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(word_lengths, st.integers(0, 2**31))
def test_ngram_spans_are_unions_of_consecutive_whole_words(lengths, seed):
    word_ids = _word_rows(lengths, pad_to=2 + 4 * 20)
    keys = example_keys(seed, torch.zeros(len(lengths), dtype=torch.int64), torch.arange(len(lengths)))
    units = ngram_units(word_ids, keys)
    assert torch.equal(units < 0, word_ids < 0)
    for row_words, row_units, n_words in zip(word_ids, units, map(len, lengths), strict=True):
        real = row_words >= 0
        words, spans = row_words[real].tolist(), row_units[real].tolist()
        # A word never straddles two spans.
        assert all(spans[i] == spans[i + 1] for i in range(len(words) - 1) if words[i] == words[i + 1])
        word_span = dict(zip(words, spans, strict=True))
        per_span = [sum(1 for s in word_span.values() if s == span) for span in range(len(set(spans)))]
        # Spans are compact, non-decreasing along the row and hold 1..4 consecutive words.
        assert [word_span[w] for w in range(n_words)] == sorted(word_span.values())
        assert set(spans) == set(range(len(per_span)))
        assert all(1 <= n <= len(NGRAM_PROBABILITIES) for n in per_span)


def test_ngram_span_lengths_follow_macbert_distribution():
    batch, length = 4000, 40
    word_ids = torch.arange(length).repeat(batch, 1)  # one token per word
    keys = example_keys(7, torch.zeros(batch, dtype=torch.int64), torch.arange(batch))
    units = ngram_units(word_ids, keys)
    counts = torch.zeros(len(NGRAM_PROBABILITIES))
    for row in units:
        _, span_lengths = torch.unique_consecutive(row, return_counts=True)
        # The first 5 spans end by word 20 < 40, so none is cut short by the row end (which would bias).
        counts += torch.bincount(span_lengths[:5] - 1, minlength=4)
    observed = counts / counts.sum()
    assert torch.allclose(observed, torch.tensor(NGRAM_PROBABILITIES), atol=0.015), observed


def test_token_units_make_every_token_its_own_unit():
    word_ids = torch.tensor([[-1, 0, 0, 1, 1, 1, -1, -1]])
    assert token_units(word_ids).tolist() == [[-1, 1, 2, 3, 4, 5, -1, -1]]
    assert masking_units(word_ids, torch.zeros(1, dtype=torch.int64), "whole_word") is word_ids


def _features(tokenizer, review_texts, n=400):
    from mlm_adapt.text.alignment import tokenize_with_word_ids
    from mlm_adapt.text.blocks import build_blocks
    from mlm_adapt.text.segmentation import JiebaSegmenter

    tokens = tokenize_with_word_ids(review_texts[:n], tokenizer, JiebaSegmenter("rjieba"))
    blocks = build_blocks(
        tokens["input_ids"], tokens["word_ids"], 64, tokenizer.cls_token_id, tokenizer.sep_token_id, True
    )
    return [
        {"input_ids": i, "word_ids": w, "example_id": k}
        for k, (i, w) in enumerate(zip(blocks["input_ids"], blocks["word_ids"], strict=True))
    ]


def test_collator_schemes_keep_the_rate_and_their_units(tokenizer, review_texts):
    features = _features(tokenizer, review_texts)
    rates, partial = {}, {}
    for scheme in ("whole_word", "ngram", "token"):
        collator = WholeWordMaskCollator(tokenizer, mlm_probability=0.15, seed=3, scheme=scheme)
        batch = collator(features)
        selected, words = batch["labels"] != -100, batch["word_ids"]
        # [UNK] inside a word is never masked (a special token), so it is left out of the word here.
        maskable = (words >= 0) & ~torch.isin(collator.pad(features)["input_ids"], collator.special_token_ids)
        rates[scheme] = (selected.sum() / maskable.sum()).item()
        # Does some jieba word have only part of its tokens selected?
        keys = (torch.arange(len(words))[:, None] * words.shape[1] + words)[maskable]
        sel = selected[maskable].long()
        n_sel = torch.zeros(int(keys.max()) + 1, dtype=torch.long).scatter_add_(0, keys, sel)
        n_tok = torch.zeros_like(n_sel).scatter_add_(0, keys, torch.ones_like(sel))
        partial[scheme] = int(((n_sel > 0) & (n_sel < n_tok)).sum())
    for scheme, rate in rates.items():
        assert abs(rate - 0.15) < 0.01, (scheme, rate)
    assert partial["whole_word"] == 0 and partial["ngram"] == 0
    assert partial["token"] > 0  # character masking does split words


def test_ngram_masks_longer_runs_than_whole_word(tokenizer, review_texts):
    features = _features(tokenizer, review_texts)

    def mean_masked_words_per_run(scheme):
        batch = WholeWordMaskCollator(tokenizer, seed=5, scheme=scheme)(features)
        selected = (batch["labels"] != -100).long()
        starts = (selected[:, 1:] > selected[:, :-1]).sum()
        masked_words = sum(
            len(torch.unique(w[s.bool()])) for w, s in zip(batch["word_ids"], selected, strict=True)
        )
        return masked_words / starts.item()

    assert mean_masked_words_per_run("ngram") > 1.3 * mean_masked_words_per_run("whole_word")
