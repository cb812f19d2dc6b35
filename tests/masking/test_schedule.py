"""Masking-rate schedules: parsing, interpolation, and the collator masking at per-example rates."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.masking import WholeWordMaskCollator
from mlm_adapt.masking.schedule import parse_schedule
from mlm_adapt.text.tokenizer import ordinary_token_ids

CHINESE_MODERNBERT = [[0.0, 0.15], [0.06, 0.30], [1.0, 0.15]]


def test_piecewise_linear_rates():
    schedule = parse_schedule(CHINESE_MODERNBERT)
    assert not schedule.constant
    assert schedule.rate(0.0) == pytest.approx(0.15)
    assert schedule.rate(0.03) == pytest.approx(0.225)
    assert schedule.rate(0.06) == pytest.approx(0.30)
    assert schedule.rate(0.53) == pytest.approx(0.225)
    assert schedule.rate(1.0) == pytest.approx(0.15)
    assert schedule.rate_at_step(0, 100) == pytest.approx(0.15)
    assert schedule.rate_at_step(6, 100) == pytest.approx(0.30)
    late_start = parse_schedule([[0.5, 0.3], [0.75, 0.1]])  # flat before the first and after the last point
    assert late_start.rate(0.1) == 0.3 and late_start.rate(0.9) == 0.1
    constant = parse_schedule(0.2)
    assert constant.constant and constant.rate(0.7) == 0.2 and constant.describe() == "0.2"
    assert "0.3 at 6%" in schedule.describe()


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (0.0, "rate 0.0 must be in (0, 1)"),
        (1.0, "rate 1.0 must be in (0, 1)"),
        ([[0.0, 0.3], [1.0, -0.1]], "rate -0.1"),
        ([[0.0, 0.3], [1.0, 1.2]], "rate 1.2"),
        ([[0.0, 0.3], [0.0, 0.15]], "strictly increasing"),
        ([[0.5, 0.3], [0.2, 0.15]], "strictly increasing"),
        ([[0.0, 0.3], [1.5, 0.15]], "fraction 1.5 must be in [0, 1]"),
        ([[-0.1, 0.3], [1.0, 0.15]], "fraction -0.1"),
        ([[0.0, 0.3, 9], [1.0, 0.15]], "[fraction_of_training, rate] pair"),
        ([], "must be a rate or a list"),
        ("0.15", "must be a rate or a list"),
        (True, "must be a rate or a list"),
    ],
    ids=[
        "zero",
        "one",
        "negative_point",
        "above_one_point",
        "repeated_fraction",
        "decreasing_fractions",
        "fraction_above_one",
        "negative_fraction",
        "triple",
        "empty",
        "string",
        "bool",
    ],
)
def test_bad_schedules_give_one_line(value, fragment):
    with pytest.raises(MLMAdaptError) as error:
        parse_schedule(value)
    message = str(error.value)
    assert "data.masking.mlm_probability" in message and fragment in message and "\n" not in message


def _features(tokenizer, n_examples, seed=0, rate=None):
    """Examples of 2-60 words of 1-4 tokens, each optionally carrying a ``mlm_probability``."""
    rng = np.random.default_rng(seed)
    vocab = ordinary_token_ids(tokenizer)
    features = []
    for n in range(n_examples):
        lengths = rng.integers(1, 5, size=int(rng.integers(2, 60)))
        ids, wids = [tokenizer.cls_token_id], [-1]
        for word, length in enumerate(lengths):
            ids += [vocab[int(rng.integers(len(vocab)))] for _ in range(length)]
            wids += [word] * int(length)
        ids.append(tokenizer.sep_token_id)
        wids.append(-1)
        feature = {"input_ids": ids, "word_ids": wids, "example_id": seed * 1000 + n, "epoch": 0}
        if rate is not None:
            feature["mlm_probability"] = rate
        features.append(feature)
    return features


@pytest.mark.parametrize("rate", [0.05, 0.15, 0.30, 0.45])
def test_realized_rate_and_80_10_10_hold_at_every_rate(tokenizer, rate):
    collator = WholeWordMaskCollator(tokenizer, mlm_probability=0.15)  # the examples' rate wins
    masked = maskable = as_mask = unchanged = 0
    for batch_index in range(40):
        batch = collator(_features(tokenizer, 16, seed=batch_index, rate=rate))
        selected = batch["labels"] != -100
        masked += int(selected.sum())
        maskable += int(batch["maskable_tokens"].sum())
        as_mask += int((batch["input_ids"][selected] == tokenizer.mask_token_id).sum())
        unchanged += int((batch["input_ids"][selected] == batch["labels"][selected]).sum())
    assert abs(masked / maskable - rate) <= 0.01
    assert abs(as_mask / masked - 0.8) <= 0.04
    # Kept words plus random replacements that happen to draw the same token: about 10%.
    assert abs(unchanged / masked - 0.1) <= 0.04


def test_examples_without_a_rate_use_the_collator_rate_bit_for_bit(tokenizer):
    collator = WholeWordMaskCollator(tokenizer, mlm_probability=0.3)
    plain = collator(_features(tokenizer, 8))
    tagged = collator(_features(tokenizer, 8, rate=0.3))
    assert torch.equal(plain["input_ids"], tagged["input_ids"])
    assert torch.equal(plain["labels"], tagged["labels"])


@settings(max_examples=60, deadline=None)
@given(
    rates=st.lists(st.floats(0.01, 0.99), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_per_example_rates_mask_whole_words_near_each_target(tokenizer, rates, seed):
    features = _features(tokenizer, len(rates), seed=seed)
    for feature, rate in zip(features, rates, strict=True):
        feature["mlm_probability"] = rate
    batch = WholeWordMaskCollator(tokenizer)(features)
    selected = batch["labels"] != -100
    word_ids = batch["word_ids"]
    for row, rate in enumerate(rates):
        words = word_ids[row]
        chosen = set(words[selected[row]].tolist())
        assert -1 not in chosen
        for word in chosen:  # whole words: every token of a chosen word is selected
            assert bool(selected[row][words == word].all())
        n_maskable = int((words >= 0).sum())
        # Exact-rate sampling: off the target by less than one word (at most 4 tokens).
        assert abs(int(selected[row].sum()) - rate * n_maskable) < 4
