"""``model.mask_attention``: the [MASK]-excluded-from-attention ablation is opt-in and loud."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from mlm_adapt.model import MaskedLMModule


def _attention_mask_seen(module: MaskedLMModule, batch: dict) -> torch.Tensor:
    seen = {}
    encoder = module.head_split.encoder
    handle = encoder.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.update(mask=kwargs["attention_mask"]), with_kwargs=True
    )
    with torch.no_grad():
        module.masked_logits(batch)
    handle.remove()
    return seen["mask"]


def _batch(tokenizer) -> dict:
    ids = torch.tensor([[tokenizer.cls_token_id, 10, tokenizer.mask_token_id, 11, tokenizer.sep_token_id, 0]])
    labels = torch.full_like(ids, -100)
    labels[0, 2] = 12
    return {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0]]), "labels": labels}


def test_attend_is_the_default_and_silent(tiny_model_dir, tokenizer):
    assert inspect.signature(MaskedLMModule).parameters["mask_attention"].default == "attend"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        module = MaskedLMModule(str(tiny_model_dir), max_seq_length=64)
    assert _attention_mask_seen(module, _batch(tokenizer)).tolist() == [[1, 1, 1, 1, 1, 0]]


def test_exclude_warns_and_hides_mask_tokens(tiny_model_dir, tokenizer):
    with pytest.warns(UserWarning, match="ABLATION"):
        module = MaskedLMModule(str(tiny_model_dir), max_seq_length=64, mask_attention="exclude")
    assert _attention_mask_seen(module, _batch(tokenizer)).tolist() == [[1, 1, 0, 1, 1, 0]]
    # Pad stays hidden and nothing else changes: only the mask positions' keys are dropped.
    module.hparams.mask_attention = "attend"
    assert _attention_mask_seen(module, _batch(tokenizer)).tolist() == [[1, 1, 1, 1, 1, 0]]
