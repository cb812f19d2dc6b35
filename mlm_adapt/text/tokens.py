"""Segment + tokenize: every token carries the index of the jieba word it came from (its word id).

Word ids are what make whole-word masking possible (``-1`` for ``[CLS]``, ``[SEP]`` and padding).
"""

from __future__ import annotations

import itertools
import sys
import weakref
from collections.abc import Sequence

import numpy as np
from transformers import PreTrainedTokenizerBase

from mlm_adapt.text.segment import Segmenter

SPECIAL_WORD_ID = -1


def tokenize_with_word_ids(
    texts: Sequence[str], tokenizer: PreTrainedTokenizerBase, segmenter: Segmenter
) -> dict[str, list[list[int]]]:
    """Segments each text into words and tokenizes it, recording a word id per token.

    A word is whatever jieba returns: a Chinese dictionary word, an English word or number (all its word
    pieces share one id), or a punctuation mark. Whitespace yields no tokens.

    BERT-style tokenizers take a fast path (:func:`_tokenize_by_chars`, several times faster) whose output is
    identical to tokenizing the word list; other tokenizers tokenize the word list.

    Args:
        texts: Documents (one string each).
        tokenizer: A fast Hugging Face tokenizer.
        segmenter: The word segmenter.

    Returns:
        ``{"input_ids": [...], "word_ids": [...]}``, one list per text, no special tokens.
    """
    words = [segmenter(text) for text in texts]
    if _bert_wordpiece(tokenizer):
        result = _tokenize_by_chars(texts, words, tokenizer)
        if result is not None:
            return result
    return _tokenize_split_words(words, tokenizer)


def _tokenize_split_words(
    words: Sequence[Sequence[str]], tokenizer: PreTrainedTokenizerBase
) -> dict[str, list[list[int]]]:
    """Tokenizes pre-split words (``is_split_into_words``); the reference for every tokenizer."""
    encoding = tokenizer(list(words), is_split_into_words=True, add_special_tokens=False)
    word_ids = [
        [SPECIAL_WORD_ID if w is None else w for w in encoding.word_ids(i)] for i in range(len(words))
    ]
    return {"input_ids": encoding["input_ids"], "word_ids": word_ids}


def _bert_wordpiece(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer runs BERT's pipeline: BertNormalizer spacing CJK, BertPreTokenizer, WordPiece."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return False
    normalizer = backend.normalizer
    return (
        type(normalizer).__name__ == "BertNormalizer"
        and bool(normalizer.handle_chinese_chars)
        and type(backend.pre_tokenizer).__name__ == "BertPreTokenizer"
        and type(backend.model).__name__ == "WordPiece"
    )


_UNKNOWN, _SPACE, _COMPLEX = -3, -2, -1


class _CharTable:
    """Per-tokenizer cache: what BERT tokenization makes of each code point, learned on first sight.

    ``>= 0``: the character is always a pre-token of its own (CJK ideograph, punctuation) and is exactly
    that token id, whatever its neighbours; ``_SPACE``: it yields no token and always splits (whitespace);
    ``_COMPLEX``: anything else (letters, digits, characters the normalizer drops or expands), which must be
    tokenized in context.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.backend = tokenizer.backend_tokenizer
        self.table = np.full(sys.maxunicode + 1, _UNKNOWN, dtype=np.int64)
        probe = self.backend.encode("a", add_special_tokens=False).ids
        self.probe = probe[0] if len(probe) == 1 else None
        self.runs: dict[str, tuple[list[int], list[int]]] = {}

    def lookup(self, codepoints: np.ndarray) -> np.ndarray:
        """Classes of ``codepoints``, classifying unseen ones with two tokenizer calls per character."""
        classes = self.table[codepoints]
        new = np.unique(codepoints[classes == _UNKNOWN])
        if len(new):
            chars = [chr(c) for c in new.tolist()]
            alone = self.backend.encode_batch(chars, add_special_tokens=False)
            # Between two letters: an isolated character keeps its own token and splits the letters apart.
            between = self.backend.encode_batch([f"a{c}a" for c in chars], add_special_tokens=False)
            a = self.probe
            for cp, one, three in zip(new.tolist(), alone, between, strict=True):
                ids, ctx = one.ids, three.ids
                if len(ids) == 1 and ctx == [a, ids[0], a]:
                    self.table[cp] = ids[0]
                elif not ids and ctx == [a, a]:
                    self.table[cp] = _SPACE
                else:
                    self.table[cp] = _COMPLEX
            classes = self.table[codepoints]
        return classes

    def tokenize_runs(self, runs: list[str]) -> list[tuple[list[int], list[int]]]:
        """Token ids and start offsets of each run, cached: runs (numbers, brands) repeat a lot."""
        cache = self.runs
        missing = list({run for run in runs if run not in cache})
        if missing:
            if len(cache) + len(missing) > _RUN_CACHE_SIZE:
                cache.clear()
            for run, encoding in zip(
                missing, self.backend.encode_batch(missing, add_special_tokens=False), strict=True
            ):
                cache[run] = (encoding.ids, [start for start, _ in encoding.offsets])
        return [cache[run] for run in runs]


_RUN_CACHE_SIZE = 200_000
_CHAR_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _char_table(tokenizer: PreTrainedTokenizerBase) -> _CharTable | None:
    table = _CHAR_TABLES.get(tokenizer)
    if table is None:
        table = _CHAR_TABLES[tokenizer] = _CharTable(tokenizer)
    return table if table.probe is not None else None


def _tokenize_by_chars(
    texts: Sequence[str], words: Sequence[Sequence[str]], tokenizer: PreTrainedTokenizerBase
) -> dict[str, list[list[int]]] | None:
    """Tokenizes a batch with a per-character table, calling the tokenizer on non-CJK runs only.

    Tokenizing a word list tokenizes each word on its own. BERT's pipeline makes every CJK ideograph and
    punctuation mark a token of its own whatever its neighbours, so a word's tokens are table lookups for
    those characters plus the tokens of the maximal runs of other characters (Latin words, numbers) between
    them, each run tokenized on its own. Runs are cut at word boundaries, tokenized in one batch call and
    placed by character offset; each token gets the index of the jieba word its first character falls in.
    The output is identical to :func:`_tokenize_split_words`; the whole batch is processed as flat arrays.
    """
    table = _char_table(tokenizer)
    if table is None:
        return None
    n_texts = len(texts)
    text_len = np.fromiter(map(len, texts), dtype=np.int64, count=n_texts)
    joined = "".join(texts)
    codepoints = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32)
    classes = table.lookup(codepoints)

    # Words, flattened over the batch: their concatenation is the concatenation of the texts.
    n_words = np.fromiter(map(len, words), dtype=np.int64, count=n_texts)
    word_len = np.array(list(map(len, itertools.chain.from_iterable(words))), dtype=np.int64)
    word_start = np.cumsum(word_len) - word_len
    first_word = np.cumsum(n_words) - n_words

    # Maximal runs of complex characters inside one word (a text starts with a word).
    complex_ = classes == _COMPLEX
    at_word_start = np.zeros(len(codepoints) + 1, dtype=bool)
    at_word_start[word_start] = True
    prev = np.concatenate(([False], complex_[:-1]))
    nxt = np.concatenate((complex_[1:], [False]))
    run_begin = np.flatnonzero(complex_ & (~prev | at_word_start[:-1]))
    run_end = np.flatnonzero(complex_ & (~nxt | at_word_start[1:])) + 1
    runs = [joined[b:e] for b, e in zip(run_begin.tolist(), run_end.tolist(), strict=True)]
    run_tokens = table.tokenize_runs(runs)
    run_ids = list(itertools.chain.from_iterable(ids for ids, _ in run_tokens))
    run_pos = np.array(list(itertools.chain.from_iterable(s for _, s in run_tokens)), dtype=np.int64)
    run_pos += np.repeat(run_begin, [len(ids) for ids, _ in run_tokens])

    simple_pos = np.flatnonzero(classes >= 0)
    ids = np.concatenate((classes[simple_pos], np.asarray(run_ids, dtype=np.int64)))
    pos = np.concatenate((simple_pos, run_pos))
    order = np.argsort(pos, kind="stable")  # runs' tokens keep their order at a shared offset
    ids, pos = ids[order], pos[order]
    # Text and word of each character, looked up at each token's first character.
    text_of = np.repeat(np.arange(n_texts), text_len)[pos]
    word_of = np.repeat(np.arange(len(word_len)) - np.repeat(first_word, n_words), word_len)[pos]
    bounds = np.concatenate(([0], np.cumsum(np.bincount(text_of, minlength=n_texts)))).tolist()
    all_ids, all_word_ids = ids.tolist(), word_of.tolist()  # one conversion, then cheap list slices
    spans = list(itertools.pairwise(bounds))
    input_ids = [all_ids[b:e] for b, e in spans]
    word_ids = [all_word_ids[b:e] for b, e in spans]
    return {"input_ids": input_ids, "word_ids": word_ids}


def join_tokens(tokens: list[str]) -> str:
    """Word pieces back to text: ``##`` pieces glued on, a space only between two ASCII alphanumerics."""
    text = ""
    for token in tokens:
        if token.startswith("##"):
            text += token[2:]
        elif (
            text and text[-1].isascii() and text[-1].isalnum() and token[:1].isascii() and token[:1].isalnum()
        ):
            text += " " + token
        else:
            text += token
    return text
