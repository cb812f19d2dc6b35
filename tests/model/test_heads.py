"""The masked-only head gives the full head's loss and logits for every model family."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from families import FAMILIES, build_model, family_dir
from transformers import AutoModelForMaskedLM, AutoTokenizer

from mlm_adapt.model.heads import split_head


def _batch(vocab_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(10, vocab_size, (3, 24), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[2, 18:] = 0
    labels = torch.where(torch.rand(input_ids.shape, generator=generator) < 0.2, input_ids, -100)
    labels[2, 18:] = -100
    return input_ids, attention_mask, labels


def _losses(model, input_ids, attention_mask, labels):
    selected = labels != -100
    full = model(input_ids=input_ids, attention_mask=attention_mask).logits[selected]
    split = split_head(model)
    assert split is not None
    partial = split.head(split.hidden(input_ids, attention_mask)[selected])
    return full, partial, labels[selected]


@pytest.mark.parametrize("family", FAMILIES)
def test_masked_only_head_equals_full_head(family):
    model = AutoModelForMaskedLM.from_pretrained(family_dir(family)).eval()
    input_ids, attention_mask, labels = _batch(model.config.vocab_size)
    full, partial, targets = _losses(model, input_ids, attention_mask, labels)
    assert partial.shape == full.shape == (targets.numel(), model.config.vocab_size)
    torch.testing.assert_close(partial, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(F.cross_entropy(partial, targets), F.cross_entropy(full, targets))


def test_deberta_non_legacy_head_takes_the_word_embeddings():
    tokenizer = AutoTokenizer.from_pretrained(family_dir("deberta"))
    model = build_model("deberta", len(tokenizer), tokenizer, legacy=False).eval()
    assert not hasattr(model, "cls")  # the head is lm_predictions(hidden, word_embeddings)
    full, partial, _ = _losses(model, *_batch(model.config.vocab_size, seed=1))
    torch.testing.assert_close(partial, full, rtol=1e-5, atol=1e-5)


def test_gradients_reach_the_same_parameters():
    model = AutoModelForMaskedLM.from_pretrained(family_dir("modernbert")).train()
    torch.manual_seed(0)
    input_ids, attention_mask, labels = _batch(model.config.vocab_size)
    split = split_head(model)
    selected = labels != -100
    F.cross_entropy(
        split.head(split.hidden(input_ids, attention_mask)[selected]), labels[selected]
    ).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_unknown_head_falls_back_with_one_info_line(caplog):
    class Unknown(torch.nn.Module):
        base_model_prefix = "body"

        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(2, 2)
            self.vocabulary_projection = torch.nn.Linear(2, 5)

    with caplog.at_level(logging.INFO):
        assert split_head(Unknown()) is None
    lines = [r.getMessage() for r in caplog.records if "masked_only_head" in r.getMessage()]
    assert len(lines) == 1 and "Unknown" in lines[0] and "full logits" in lines[0]


def test_a_model_without_sdpa_loads_with_its_own_attention():
    from mlm_adapt.model.loading import load_masked_lm

    # model.attn_implementation defaults to sdpa, which DeBERTa-v2 lacks: loading used to fail.
    model, _ = load_masked_lm(str(family_dir("deberta")), attn_implementation="sdpa")
    assert model.config._attn_implementation == "eager"
    assert load_masked_lm(str(family_dir("bert")))[0].config._attn_implementation == "sdpa"
