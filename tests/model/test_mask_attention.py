"""[MASK] tokens are attended in training as any token (only padding gets 0): no option turns it off."""

from __future__ import annotations

import inspect
import warnings

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


def test_mask_tokens_are_attended_and_no_option_turns_it_off(tiny_model_dir, tokenizer):
    assert "mask_attention" not in inspect.signature(MaskedLMModule).parameters
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        module = MaskedLMModule(str(tiny_model_dir), max_seq_length=64)
    assert _attention_mask_seen(module, _batch(tokenizer)).tolist() == [[1, 1, 1, 1, 1, 0]]
