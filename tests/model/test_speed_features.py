"""Speed features change no result: masked-only head, sdpa, compile, length grouping, throughput logs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import make_datamodule, quiet_trainer

from mlm_adapt.data.samplers import EpochSampler, KeyedDataset, LengthGroupedEpochSampler
from mlm_adapt.masking import WholeWordMaskCollator
from mlm_adapt.model import MaskedLMModule
from mlm_adapt.text.alignment import tokenize_with_word_ids
from mlm_adapt.text.blocks import build_blocks
from mlm_adapt.text.segmentation import JiebaSegmenter


@pytest.fixture(scope="module")
def line_blocks(review_texts, tokenizer):
    """Line-by-line blocks (packing off) of real reviews: lengths vary a lot."""
    tokens = tokenize_with_word_ids(review_texts, tokenizer, JiebaSegmenter())
    return build_blocks(
        tokens["input_ids"],
        tokens["word_ids"],
        128,
        tokenizer.cls_token_id,
        tokenizer.sep_token_id,
        packing=False,
    )


@pytest.fixture(scope="module")
def batch(line_blocks, tokenizer):
    pairs = zip(line_blocks["input_ids"][:24], line_blocks["word_ids"][:24], strict=True)
    features = [{"input_ids": i, "word_ids": w, "example_id": n} for n, (i, w) in enumerate(pairs)]
    out = WholeWordMaskCollator(tokenizer, mlm_probability=0.3)(features)
    assert (out["attention_mask"] == 0).any() and (out["labels"] != -100).sum() > 50
    return out


def _loss_and_hits(module: MaskedLMModule, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits, labels = module.masked_logits(batch)
    return F.cross_entropy(logits.float(), labels), logits.argmax(-1) == labels, logits


def test_masked_only_head_matches_full_head(tiny_model_dir, batch):
    fast = MaskedLMModule(str(tiny_model_dir), max_seq_length=128, masked_only_head=True)
    full = MaskedLMModule(str(tiny_model_dir), max_seq_length=128, masked_only_head=False)
    assert fast.head_split is not None and full.head_split is None
    fast.eval(), full.eval()
    with torch.no_grad():
        loss_fast, hits_fast, logits_fast = _loss_and_hits(fast, batch)
        loss_full, hits_full, logits_full = _loss_and_hits(full, batch)
    torch.testing.assert_close(logits_fast, logits_full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss_fast, loss_full, rtol=1e-6, atol=1e-6)
    assert torch.equal(hits_fast, hits_full)  # accuracy identical
    # Training gradients agree too (same dropout draws: the head itself has no dropout).
    fast.train(), full.train()
    for module in (fast, full):
        torch.manual_seed(0)
        _loss_and_hits(module, batch)[0].backward()
    for (name, a), (_, b) in zip(fast.model.named_parameters(), full.model.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_sdpa_matches_eager(tiny_model_dir, batch):
    sdpa = MaskedLMModule(str(tiny_model_dir), max_seq_length=128).eval()
    eager = MaskedLMModule(str(tiny_model_dir), max_seq_length=128, attn_implementation="eager").eval()
    assert sdpa.model.config._attn_implementation == "sdpa"
    assert eager.model.config._attn_implementation == "eager"
    with torch.no_grad():
        loss_sdpa, hits_sdpa, logits_sdpa = _loss_and_hits(sdpa, batch)
        loss_eager, hits_eager, logits_eager = _loss_and_hits(eager, batch)
    torch.testing.assert_close(logits_sdpa, logits_eager, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(loss_sdpa, loss_eager, rtol=1e-5, atol=1e-5)
    assert hits_sdpa.float().mean().item() == pytest.approx(hits_eager.float().mean().item(), abs=0.01)


def test_compile_option_changes_no_result(tiny_model_dir, batch):
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    plain = MaskedLMModule(str(tiny_model_dir), max_seq_length=128).eval()
    compiled = MaskedLMModule(str(tiny_model_dir), max_seq_length=128, compile={"backend": counter}).eval()
    compiled.configure_model()
    torch._dynamo.reset()
    with torch.no_grad():
        expected = _loss_and_hits(plain, batch)
        got = _loss_and_hits(compiled, batch)
    assert counter.frame_count > 0  # the compiled modules really ran
    torch.testing.assert_close(got[2], expected[2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[0], expected[0])
    # In-place compilation keeps checkpoint/export keys unchanged.
    assert compiled.model.state_dict().keys() == plain.model.state_dict().keys()


@pytest.mark.parametrize(("world", "drop_last"), [(1, False), (2, False), (3, True)])
def test_length_grouped_sampler_keeps_distributed_semantics(world, drop_last):
    lengths = np.random.RandomState(0).randint(3, 128, 1003)
    dataset = list(range(len(lengths)))
    grouped = [
        LengthGroupedEpochSampler(dataset, lengths, 64, world, r, seed=5, drop_last=drop_last)
        for r in range(world)
    ]
    plain = [
        EpochSampler(dataset, num_replicas=world, rank=r, seed=5, drop_last=drop_last) for r in range(world)
    ]
    for epoch in (0, 1):
        for s in grouped + plain:
            s.set_epoch(epoch)
        got = [list(s) for s in grouped]
        want = [list(s) for s in plain]
        assert all(key.epoch == epoch for rank in got for key in rank)
        assert [len(r) for r in got] == [len(r) for r in want]
        assert sorted(k.index for r in got for k in r) == sorted(k.index for r in want for k in r)
    assert isinstance(grouped[0], torch.utils.data.DistributedSampler)
    grouped[0].set_epoch(0)
    first = list(grouped[0])
    grouped[0].set_epoch(1)
    assert list(grouped[0]) != first  # reshuffled every epoch


def test_length_grouping_reduces_padding_and_keeps_masks(line_blocks, tokenizer):
    import datasets

    ds = datasets.Dataset.from_dict(line_blocks)
    keyed = KeyedDataset(ds)
    lengths = np.array([len(x) for x in line_blocks["input_ids"]])
    collator = WholeWordMaskCollator(tokenizer)
    batch_size = 16

    def run(sampler):
        sampler.set_epoch(1)
        keys = list(sampler)
        per_example, padded = {}, 0
        for start in range(0, len(keys), batch_size):
            feats = [keyed[k] for k in keys[start : start + batch_size]]
            out = collator(feats)
            padded += int((out["attention_mask"] == 0).sum())
            for row, f in enumerate(feats):
                n = len(f["input_ids"])
                per_example[f["example_id"]] = (
                    out["input_ids"][row, :n].tolist(),
                    out["labels"][row, :n].tolist(),
                )
        return per_example, padded

    plain, plain_pad = run(EpochSampler(ds, num_replicas=1, rank=0, seed=0))
    grouped, grouped_pad = run(LengthGroupedEpochSampler(ds, lengths, 50 * batch_size, 1, 0, seed=0))
    assert grouped == plain  # every example gets the same masked input and labels
    assert grouped_pad < 0.5 * plain_pad


def test_datamodule_picks_grouped_sampler_only_line_by_line(corpus_file, tiny_model_dir, tmp_path):
    for packing, grouped in ((False, True), (True, False)):
        dm = make_datamodule(tiny_model_dir, corpus_file, tmp_path, blocks={"packing": packing})
        dm.setup("fit")
        sampler = dm.train_dataloader().sampler
        assert isinstance(sampler, LengthGroupedEpochSampler) is grouped
        assert isinstance(sampler, EpochSampler)
    dm = make_datamodule(
        tiny_model_dir, corpus_file, tmp_path, blocks={"packing": False, "group_by_length": False}
    )
    dm.setup("fit")
    assert not isinstance(dm.train_dataloader().sampler, LengthGroupedEpochSampler)


def test_throughput_logged_during_fit(corpus_file, tiny_model_dir, tmp_path):
    import csv

    from lightning.pytorch.loggers import CSVLogger

    from mlm_adapt.model.module import MLMThroughputMonitor

    dm = make_datamodule(tiny_model_dir, corpus_file, tmp_path)
    module = MaskedLMModule(str(tiny_model_dir), max_seq_length=64)
    trainer = quiet_trainer(
        max_steps=6,
        log_every_n_steps=1,
        limit_val_batches=0,
        logger=CSVLogger(tmp_path),
        callbacks=[MLMThroughputMonitor(window_size=3)],
    )
    trainer.fit(module, datamodule=dm)
    assert (
        sum(isinstance(c, MLMThroughputMonitor) for c in trainer.callbacks) == 1
    )  # no duplicate from the module
    with open(trainer.logger.experiment.metrics_file_path) as f:
        rows = list(csv.DictReader(f))
    seen = {k for row in rows for k, v in row.items() if v}
    assert {
        "train/device/samples_per_sec",
        "train/device/items_per_sec",
        "train/device/flops_per_sec",
        "train/non_pad_fraction",
    } <= seen
    fractions = [float(r["train/non_pad_fraction"]) for r in rows if r.get("train/non_pad_fraction")]
    assert all(0.9 <= f <= 1.0 for f in fractions)  # packing: almost no padding
    assert module.flops_per_batch and module.flops_per_batch > 0


def test_module_adds_throughput_monitor_by_default(tiny_model_dir):
    import lightning as L

    from mlm_adapt.model.module import MLMThroughputMonitor

    module = MaskedLMModule(str(tiny_model_dir), max_seq_length=64)
    module.trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    assert [type(c) for c in module.configure_callbacks()] == [MLMThroughputMonitor]
