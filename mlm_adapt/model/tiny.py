"""Builds tiny (and real-size) Chinese checkpoints offline, for the demo, tests and benchmarks: ordinary
``save_pretrained`` directories, loaded like ``hfl/chinese-bert-wwm-ext``; only size and vocabulary differ."""

from __future__ import annotations

import string
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertTokenizerFast,
    ModernBertConfig,
    ModernBertForMaskedLM,
    PreTrainedModel,
)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def chinese_vocab(texts: Iterable[str], max_chars: int = 3000) -> list[str]:
    """A BERT-Chinese-style vocabulary: specials, ASCII and ``##`` pieces, and the ``max_chars`` most
    frequent non-ASCII, non-space characters of ``texts``."""
    counts = Counter(ch for text in texts for ch in text if not ch.isspace() and not ch.isascii())
    ascii_tokens = list(string.ascii_lowercase + string.digits + string.punctuation)
    pieces = ["##" + ch for ch in string.ascii_lowercase + string.digits]
    chars = [ch for ch, _ in counts.most_common(max_chars)]
    return SPECIAL_TOKENS + ascii_tokens + pieces + chars


def _tokenizer(vocab: list[str]) -> BertTokenizerFast:
    return BertTokenizerFast(vocab={tok: i for i, tok in enumerate(vocab)}, do_lower_case=True)


def _save(model: PreTrainedModel, tokenizer: BertTokenizerFast, output_dir: str | Path) -> Path:
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return output_dir


def build_tiny_bert(
    output_dir: str | Path,
    texts: Iterable[str],
    max_chars: int = 3000,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    seed: int = 0,
) -> Path:
    """Writes a randomly initialized (``seed``) ``BertForMaskedLM`` of the given sizes and its fast tokenizer
    to ``output_dir`` (returned); its vocabulary is :func:`chinese_vocab` of ``texts`` and ``max_chars``."""
    vocab = chinese_vocab(texts, max_chars)
    tokenizer = _tokenizer(vocab)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    return _save(BertForMaskedLM(config), tokenizer, output_dir)


def build_real_size(
    output_dir: str | Path, texts: Iterable[str], family: str = "bert", seed: int = 0
) -> Path:
    """Writes a randomly initialized (``seed``) model of a real checkpoint's size to ``output_dir``.

    ``family`` ``bert``: bert-base-chinese's shape (12 x 768, FFN 3072, vocabulary 21,128, 102 M parameters);
    ``modernbert``: ModernBERT-base's (22 x 768, FFN 1152, vocabulary 50,368, alternating global/128-token
    local attention, 150 M parameters). The vocabulary holds the characters of ``texts``, then CJK ideographs
    in code point order (as most of bert-base-chinese's entries are), then ``[unusedN]``.
    """
    size = 21_128 if family == "bert" else 50_368
    vocab = chinese_vocab(texts, max_chars=size)[:size]
    present = set(vocab)
    fill = (chr(c) for c in range(0x4E00, 0xA000) if chr(c) not in present)
    vocab += [ch for _, ch in zip(range(size - len(vocab)), fill, strict=False)]
    vocab += [f"[unused{i}]" for i in range(size - len(vocab))]
    tokenizer = _tokenizer(vocab)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("[PAD]", "[CLS]", "[SEP]")}
    torch.manual_seed(seed)
    if family == "bert":
        config = BertConfig(vocab_size=len(vocab), max_position_embeddings=512, pad_token_id=ids["[PAD]"])
        model = BertForMaskedLM(config)
    elif family == "modernbert":
        config = ModernBertConfig(
            vocab_size=len(vocab),
            hidden_size=768,
            num_hidden_layers=22,
            num_attention_heads=12,
            intermediate_size=1152,
            max_position_embeddings=8192,
            pad_token_id=ids["[PAD]"],
            cls_token_id=ids["[CLS]"],
            sep_token_id=ids["[SEP]"],
            bos_token_id=ids["[CLS]"],
            eos_token_id=ids["[SEP]"],
        )
        model = ModernBertForMaskedLM(config)
    else:
        raise ValueError(f"family must be 'bert' or 'modernbert', got {family!r}")
    tokenizer.model_max_length = 512
    return _save(model, tokenizer, output_dir)
