"""Preview renders masked words that contain an unmaskable [UNK] piece (label -100)."""

from __future__ import annotations

from mlm_adapt.cli.data_only import render_text


def test_masked_word_with_an_unk_piece(tokenizer):
    bei, jing = tokenizer.convert_tokens_to_ids(["北", "京"])
    unk, mask = tokenizer.unk_token_id, tokenizer.mask_token_id
    # One word of three pieces: 北 masked, [UNK] left alone (never a label), 京 kept but predicted.
    example = {
        "tokens": ["[CLS]", "[MASK]", "[UNK]", "京", "[SEP]"],
        "input_ids": [tokenizer.cls_token_id, mask, unk, jing, tokenizer.sep_token_id],
        "attention_mask": [1, 1, 1, 1, 1],
        "labels": [-100, bei, -100, jing, -100],
        "word_ids": [None, 0, 0, 0, None],
    }
    text = render_text(example, tokenizer)
    assert "【北[UNK]京→[MASK][UNK]京】" in text
    assert text.startswith("# 5 tokens, 2 masked")  # predicted tokens: the [UNK] is not one
