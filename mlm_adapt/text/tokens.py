"""Segment + tokenize: every token carries the id of the jieba word (masking unit) it belongs to.

Word ids are what make whole-word masking possible (``-1`` for ``[CLS]``, ``[SEP]`` and padding). The tokens
are the tokenizer's own tokenization of each whole text, for every tokenizer family; words are aligned to
them afterwards (:mod:`mlm_adapt.text.alignment`).
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from mlm_adapt.text.alignment import AlignedTokens, align_words, align_words_flat
from mlm_adapt.text.segmentation import WordSegmenter

SPECIAL_WORD_ID = -1
# Bumped whenever the tokens or word ids produced for a text change: it is part of the datasets cache
# fingerprint (see mlm_adapt.data.preprocess), so caches written by an older version are not reused.
TOKENIZATION_VERSION = 3


def tokenize_with_word_ids(
    texts: Sequence[str], tokenizer: PreTrainedTokenizerBase, segmenter: WordSegmenter
) -> dict[str, list[list[int]]]:
    """Tokenizes each text whole and gives every token the id of the jieba word it belongs to.

    The tokens are ``tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]``
    (special-token strings in the text are text; see :mod:`mlm_adapt.text.alignment`). A word is whatever
    jieba returns (a Chinese dictionary word, an English word or number, a punctuation mark); words that one
    token spans are joined into one id (masked together), whitespace and ``▁``/``Ġ`` markers belong to the
    following word, and byte-level pieces of one character share its word.

    Args:
        texts: Documents (one string each).
        tokenizer: A fast Hugging Face tokenizer.
        segmenter: The word segmenter (:class:`~mlm_adapt.text.segmentation.Segmentation` checks that its
            words join back to each text).

    Returns:
        ``{"input_ids": [...], "word_ids": [...]}``, one list per text, no special tokens; word ids increase
        along each text.
    """
    texts = list(texts)
    return align_words(texts, segmenter.segment(texts), tokenizer)


def tokenize_flat(
    texts: Sequence[str], tokenizer: PreTrainedTokenizerBase, segmenter: WordSegmenter
) -> AlignedTokens:
    """:func:`tokenize_with_word_ids` as flat arrays, unit ids numbered over the batch (for packing)."""
    texts = list(texts)
    return align_words_flat(texts, segmenter.segment(texts), tokenizer)
