"""Segment + tokenize: every token of the tokenizer's own tokenization gets the id of its jieba word.

Whole-word masking needs a word id per token (``-1`` for ``[CLS]``, ``[SEP]`` and padding), but the tokens
must be exactly what the tokenizer produces for the text (``add_special_tokens=False``,
``split_special_tokens=True``), or the model trains on a tokenization it never sees at inference.
Tokenizing jieba's word list instead gives every word its own ``▁`` prefix (SentencePiece), keeps
byte-level BPE merges from crossing a word boundary, and splits BERT's ``１０`` into ``１ ０``.

So each text is tokenized whole, with character offsets, and each token gets the jieba word covering its
characters:

- a token whose characters span several words (a merge across a jieba boundary: ``真的很``, ``10`` from
  ``１０``) joins those words into one *unit*: they are masked together;
- whitespace belongs to the word that follows it, so a bare prefix/space marker (``▁``, ``Ġ``) and a piece
  like ``▁6`` belong to the following word (to the preceding one at the end of a text);
- a token with an empty span (a marker the normalizer added) belongs to the word at its position;
- byte-level pieces of one character have that character's span and therefore share its word.

Word ids increase along each text, with gaps (blocks compact them). Text is text: special-token strings
in a document (``[MASK]``, ``<s>``) are ordinary characters, never control tokens, even where the
vocabulary model has them as pieces (:func:`_spell_out`). Everything after the tokenizer call is
vectorized with numpy; BERT's pipeline skips tokenizing CJK characters (:class:`_CharTable`) and
byte-level BPE skips offset tracking (:class:`_ByteTable`), with the same tokens and offsets.
"""

from __future__ import annotations

import itertools
import json
import sys
import unicodedata
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import pre_tokenizers
from transformers import PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.segmentation import WordSegmenter

# Bumped whenever the tokens or word ids produced for a text change: it is part of the datasets cache
# fingerprint (see mlm_adapt.data.preprocess), so caches written by an older version are not reused.
TOKENIZATION_VERSION = 3

# Unicode whitespace below U+3001 (``str.isspace``): U+3000, the ideographic space, is the last one.
_WHITESPACE = np.zeros(0x3001, dtype=bool)
_WHITESPACE[[c for c in range(0x3001) if chr(c).isspace()]] = True


@dataclass
class TokenSpans:
    """Tokens of a batch of texts, flat: ids and character spans in the concatenation of the texts."""

    ids: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    counts: np.ndarray  # tokens per text


@dataclass
class AlignedTokens:
    """Tokens of a batch of texts, flat, each with its unit (merged word) id, numbered over the whole batch
    (increasing along the texts, so a block cut from several texts never needs renumbering)."""

    ids: np.ndarray
    units: np.ndarray
    counts: np.ndarray  # tokens per text


def tokenize_flat(
    texts: Sequence[str], tokenizer: PreTrainedTokenizerBase, segmenter: WordSegmenter
) -> AlignedTokens:
    """:func:`tokenize_with_word_ids` as flat arrays, unit ids numbered over the batch (for packing)."""
    texts = list(texts)
    words = segmenter.segment(texts)
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    spans = token_spans(texts, tokenizer)
    unit = _token_units(spans, _char_words("".join(texts), lengths, words), lengths)
    return AlignedTokens(spans.ids, unit, spans.counts)


def tokenize_with_word_ids(
    texts: Sequence[str], tokenizer: PreTrainedTokenizerBase, segmenter: WordSegmenter
) -> dict[str, list[list[int]]]:
    """Tokenizes each text whole and gives every token the id of the jieba word it belongs to.

    Words that one token spans are joined into one id (masked together); see the module docstring. The
    tokenizer is a fast Hugging Face one; :class:`~mlm_adapt.text.segmentation.Segmentation` checks that the
    segmenter's words join back to each text. Returns ``{"input_ids": [...], "word_ids": [...]}``, one list
    per text, no special tokens; word ids increase along each text, from 0.
    """
    aligned = tokenize_flat(texts, tokenizer, segmenter)
    # Per-text ids starting at 0 (units increase along a text, so the first token has the smallest).
    present = aligned.counts[aligned.counts > 0]
    unit = aligned.units - np.repeat(aligned.units[np.cumsum(present) - present], present)
    bounds = np.concatenate(([0], np.cumsum(aligned.counts))).tolist()
    all_ids, all_units = aligned.ids.tolist(), unit.tolist()
    pairs = list(itertools.pairwise(bounds))
    return {
        "input_ids": [all_ids[b:e] for b, e in pairs],
        "word_ids": [all_units[b:e] for b, e in pairs],
    }


def _char_words(joined: str, lengths: np.ndarray, words: Sequence[Sequence[str]]) -> np.ndarray:
    """Global word index of every character; whitespace takes the word of the next non-space character."""
    n_chars = len(joined)
    word_len = np.fromiter(map(len, itertools.chain.from_iterable(words)), dtype=np.int64)
    if int(word_len.sum()) != n_chars:
        raise _join_back_error(joined, lengths, words)
    char_word = np.repeat(np.arange(len(word_len), dtype=np.int64), word_len)
    codepoints = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32)
    space = np.zeros(n_chars, dtype=bool)
    low = codepoints < len(_WHITESPACE)
    space[low] = _WHITESPACE[codepoints[low]]
    if space.any():
        text_of = np.repeat(np.arange(len(lengths)), lengths)
        index = np.arange(n_chars)
        # Next non-space character (n_chars if none), then the previous one (-1 if none).
        nxt = np.minimum.accumulate(np.where(space, n_chars, index)[::-1])[::-1]
        prv = np.maximum.accumulate(np.where(space, -1, index))
        nxt_ok = nxt < n_chars
        nxt_ok[nxt_ok] = text_of[nxt[nxt_ok]] == text_of[nxt_ok]
        prv_ok = prv >= 0
        prv_ok[prv_ok] = text_of[prv[prv_ok]] == text_of[prv_ok]
        source = np.where(nxt_ok, nxt, np.where(prv_ok, prv, index))
        char_word = np.where(space, char_word[source], char_word)
    return char_word


def _join_back_error(joined: str, lengths: np.ndarray, words: Sequence[Sequence[str]]) -> MLMAdaptError:
    """The one line for words that do not join back (a segmenter used without
    :class:`~mlm_adapt.text.segmentation.Segmentation`)."""
    start = 0
    for length, text_words in zip(lengths.tolist(), words, strict=False):
        text = joined[start : start + length]
        start += length
        if "".join(text_words) != text:
            return MLMAdaptError(
                f"data.segmentation.segmenter: words do not join back to the text {text[:60]!r}; a segmenter "
                "must return every character of the text, whitespace included"
            )
    return MLMAdaptError(
        f"data.segmentation.segmenter: {len(words)} word lists for {len(lengths)} texts; give one per text"
    )


def _token_units(spans: TokenSpans, char_word: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Unit id of each token: words that one token spans are merged into one unit (global numbering)."""
    n_words = int(char_word.max()) + 1 if len(char_word) else 0
    if not len(spans.ids):
        return np.zeros(0, dtype=np.int64)
    text_end = np.repeat(np.cumsum(lengths), spans.counts)
    starts, ends = spans.starts, spans.ends
    empty = ends <= starts
    # An empty span belongs to the word at its position (the last character's at the end of a text).
    first_char = np.where(empty & (starts >= text_end), starts - 1, starts)
    last_char = np.where(empty, first_char, ends - 1)
    lo, hi = char_word[first_char], char_word[last_char]
    # Words k and k+1 are joined when a token covers both: count open spans with a difference array.
    open_spans = np.cumsum(np.bincount(lo, minlength=n_words + 1) - np.bincount(hi, minlength=n_words + 1))
    new_unit = np.ones(n_words, dtype=np.int64)
    new_unit[1:] = open_spans[: n_words - 1] <= 0
    unit_of_word = np.cumsum(new_unit) - 1
    return unit_of_word[lo]


def token_spans(texts: Sequence[str], tokenizer: PreTrainedTokenizerBase) -> TokenSpans:
    """Token ids and character spans of each text, tokenized whole without special tokens."""
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    text_start = np.cumsum(lengths) - lengths
    table = _char_table(tokenizer) if bert_wordpiece(tokenizer) else None
    if table is not None:
        return _bert_spans(texts, table, lengths, text_start)
    byte_table = _byte_table(tokenizer)
    if byte_table is not None:
        spans = byte_table.spans(texts, lengths)
        if spans is not None:
            return spans
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.truncation is None and backend.padding is None:
        encodings = _encode(backend, texts)
        ids = [e.ids for e in encodings]
        offsets = [e.offsets for e in encodings]
    else:  # the public call: it switches a saved truncation/padding setting off
        encoded = tokenizer(
            list(texts), add_special_tokens=False, return_offsets_mapping=True, split_special_tokens=True
        )
        ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    control = control_ids(tokenizer)
    if backend is not None and control:
        for row, text in enumerate(texts):
            if not control.isdisjoint(ids[row]):
                ids[row], offsets[row] = _spell_out(ids[row], offsets[row], text, backend, control)
    flat_ids, counts = flatten(ids)
    pairs = itertools.chain.from_iterable(itertools.chain.from_iterable(offsets))
    flat_offsets = np.fromiter(pairs, dtype=np.int64, count=2 * len(flat_ids)).reshape(-1, 2)
    shift = np.repeat(text_start, counts)
    return TokenSpans(flat_ids, flat_offsets[:, 0] + shift, flat_offsets[:, 1] + shift, counts)


def flatten(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ints as one ``int64`` array, and the length of each row."""
    counts = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    return np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(counts.sum())), counts


def _encode(backend: Any, texts: Sequence[str], offsets: bool = True) -> list:
    """The Rust tokenizer's ``encode_batch`` (without ``offsets``: ``encode_batch_fast``) of ``texts``, with
    text as text: "[MASK]" in a document is no mask token."""
    encode = backend.encode_batch if offsets else backend.encode_batch_fast
    matching = backend.encode_special_tokens
    backend.encode_special_tokens = True
    try:
        return encode(list(texts), add_special_tokens=False)
    finally:
        backend.encode_special_tokens = matching


def control_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Ids of the tokenizer's special tokens that control the model ([CLS], <s>, [MASK]...; not unknown)."""
    return set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}


def _spell_out(
    ids: Sequence[int], offsets: Sequence[tuple[int, int]], text: str, backend: Any, control: set[int]
) -> tuple[list[int], list[tuple[int, int]]]:
    """``ids`` with every control token that the vocabulary model itself matched in the text (SentencePiece
    vocabularies list ``<s>``, ``[MASK]`` as pieces) replaced by the pieces of its characters, one each."""
    new_ids: list[int] = []
    new_offsets: list[tuple[int, int]] = []
    for token, (start, end) in zip(ids, offsets, strict=True):
        if token not in control or end <= start:
            new_ids.append(token)
            new_offsets.append((start, end))
            continue
        for position in range(start, end):
            for piece in backend.model.tokenize(text[position]):
                new_ids.append(piece.id)
                new_offsets.append((position, position + 1))
    return new_ids, new_offsets


def _fast_path_backend(tokenizer: PreTrainedTokenizerBase) -> Any:
    """The Rust tokenizer, when a fast path may replace it: no saved truncation/padding, no added tokens
    (matched in the raw text before the model's pipeline runs, a per-character or per-byte table cannot
    see them)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return None
    special = set(tokenizer.all_special_tokens)
    if any(token not in special for token in tokenizer.get_added_vocab()):
        return None
    return backend


def bert_wordpiece(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer runs BERT's pipeline: BertNormalizer spacing CJK, BertPreTokenizer, WordPiece."""
    backend = _fast_path_backend(tokenizer)
    if backend is None:
        return False
    normalizer = backend.normalizer
    return (
        type(normalizer).__name__ == "BertNormalizer"
        and bool(normalizer.handle_chinese_chars)
        and type(backend.pre_tokenizer).__name__ == "BertPreTokenizer"
        and type(backend.model).__name__ == "WordPiece"
    )


_UNKNOWN, _SPACE, _COMPLEX = -3, -2, -1
_RUN_CACHE_SIZE = 200_000


class _CharTable:
    """Per-tokenizer cache: what BERT tokenization makes of each code point, learned on first sight.

    ``>= 0``: the character is always a token of its own (CJK ideograph, punctuation) and is exactly that
    token id, whatever its neighbours; ``_SPACE``: it yields no token and always splits (whitespace);
    ``_COMPLEX``: anything else (letters, digits, characters the normalizer drops or expands).

    Such a character is a hard boundary of BERT's pre-tokenization, so the tokens of a text are the table
    entries of its simple characters plus the tokens of each maximal run of complex characters between them,
    tokenized on its own. Runs are *not* cut at jieba boundaries (``１０`` is one run, as for the tokenizer).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.backend = tokenizer.backend_tokenizer
        self.table = np.full(sys.maxunicode + 1, _UNKNOWN, dtype=np.int64)
        probe = self.backend.encode("a", add_special_tokens=False).ids
        self.probe = probe[0] if len(probe) == 1 else None
        self.runs: dict[str, tuple[list[int], list[int], list[int]]] = {}

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
                if len(ids) == 1 and ctx == [a, ids[0], a] and one.offsets[0] == (0, 1):
                    self.table[cp] = ids[0]
                elif not ids and ctx == [a, a]:
                    self.table[cp] = _SPACE
                else:
                    self.table[cp] = _COMPLEX
            classes = self.table[codepoints]
        return classes

    def tokenize_runs(self, runs: list[str]) -> list[tuple[list[int], list[int], list[int]]]:
        """Token ids, start and end offsets of each run, cached: runs (numbers, brands) repeat a lot."""
        cache = self.runs
        missing = list({run for run in runs if run not in cache})
        if missing:
            if len(cache) + len(missing) > _RUN_CACHE_SIZE:
                cache.clear()
            for run, enc in zip(
                missing, self.backend.encode_batch(missing, add_special_tokens=False), strict=True
            ):
                cache[run] = (enc.ids, [s for s, _ in enc.offsets], [e for _, e in enc.offsets])
        return [cache[run] for run in runs]


_CHAR_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _char_table(tokenizer: PreTrainedTokenizerBase) -> _CharTable | None:
    table = _CHAR_TABLES.get(tokenizer)
    if table is None:
        table = _CHAR_TABLES[tokenizer] = _CharTable(tokenizer)
    return table if table.probe is not None else None


def _bert_spans(
    texts: Sequence[str], table: _CharTable, lengths: np.ndarray, text_start: np.ndarray
) -> TokenSpans:
    """BERT's tokens from the character table plus one tokenizer call per distinct run of complex chars."""
    joined = "".join(texts)
    codepoints = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32)
    classes = table.lookup(codepoints)
    complex_ = classes == _COMPLEX
    # Maximal runs of complex characters, never crossing a text boundary.
    at_text_start = np.zeros(len(codepoints) + 1, dtype=bool)
    at_text_start[text_start] = True
    prev = np.concatenate(([False], complex_[:-1]))
    nxt = np.concatenate((complex_[1:], [False]))
    run_begin = np.flatnonzero(complex_ & (~prev | at_text_start[:-1]))
    run_end = np.flatnonzero(complex_ & (~nxt | at_text_start[1:])) + 1
    runs = [joined[b:e] for b, e in zip(run_begin.tolist(), run_end.tolist(), strict=True)]
    run_tokens = table.tokenize_runs(runs)
    run_ids, n_run_tokens = flatten([t[0] for t in run_tokens])
    shift = np.repeat(run_begin, n_run_tokens)
    run_starts = flatten([t[1] for t in run_tokens])[0] + shift
    run_ends = flatten([t[2] for t in run_tokens])[0] + shift

    simple_pos = np.flatnonzero(classes >= 0)
    ids = np.concatenate((classes[simple_pos], run_ids))
    starts = np.concatenate((simple_pos, run_starts))
    ends = np.concatenate((simple_pos + 1, run_ends))
    order = np.argsort(starts, kind="stable")  # a run's tokens keep their order at a shared offset
    ids, starts, ends = ids[order], starts[order], ends[order]
    text_of = np.repeat(np.arange(len(lengths)), lengths)
    return TokenSpans(ids, starts, ends, np.bincount(text_of[starts], minlength=len(lengths)))


# Post-processors that leave encode()'s offsets as the model's tokens cover the text (no whitespace trimming).
_UNTRIMMED = ("TemplateProcessing", "BertProcessing")


def _keeps_offsets(post_processor: dict | None) -> bool:
    if post_processor is None:
        return True
    kind = post_processor.get("type")
    if kind == "Sequence":
        return all(_keeps_offsets(p) for p in post_processor.get("processors", []))
    if kind in ("ByteLevel", "RobertaProcessing"):
        return post_processor.get("trim_offsets") is False
    return kind in _UNTRIMMED


def _ends_in_byte_level(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return False
    if pre_tokenizer.get("type") == "Sequence":
        parts = pre_tokenizer.get("pretokenizers") or []
        return bool(parts) and _ends_in_byte_level(parts[-1])
    return pre_tokenizer.get("type") == "ByteLevel" and not pre_tokenizer.get("add_prefix_space")


class _ByteTable:
    """Per-tokenizer byte length of every token of a byte-level BPE: spans without offset tracking.

    A byte-level BPE token is a run of the text's UTF-8 bytes (one alphabet character per byte), and the
    tokens of a text are all its bytes in order. So the span of a token is the characters of its bytes:
    from the character holding its first byte to the one holding its last (a piece of one character gets
    that character, as the tokenizer's own offsets say). Every batch is checked: when the tokens' bytes do
    not add up to each text's (a normalizer changed it), or a control id appears, the batch takes the
    generic path.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab: dict[str, int], nfc: bool):
        self.backend = tokenizer.backend_tokenizer
        self.byte_length = np.zeros(max(vocab.values(), default=0) + 1, dtype=np.int64)
        for token, index in vocab.items():
            self.byte_length[index] = len(token)
        self.control = np.asarray(sorted(control_ids(tokenizer)), dtype=np.int64)
        self.nfc = nfc  # the normalizer is NFC: texts it would change take the generic path

    def spans(self, texts: Sequence[str], lengths: np.ndarray) -> TokenSpans | None:
        """The batch's tokens and spans, or ``None`` when this batch needs the tokenizer's own offsets."""
        if self.nfc and not all(unicodedata.is_normalized("NFC", text) for text in texts):
            return None
        encodings = _encode(self.backend, texts, offsets=False)
        flat_ids, counts = flatten([e.ids for e in encodings])
        if (len(flat_ids) and flat_ids.max() >= len(self.byte_length)) or np.isin(
            flat_ids, self.control
        ).any():
            return None
        raw = np.frombuffer("".join(texts).encode("utf-8"), dtype=np.uint8)
        char_starts = (raw & 0xC0) != 0x80  # not a UTF-8 continuation byte
        byte_length = self.byte_length[flat_ids]
        token_text = np.repeat(np.arange(len(counts)), counts)
        token_bytes = np.bincount(token_text, weights=byte_length, minlength=len(lengths))
        char_byte = np.append(np.flatnonzero(char_starts), len(raw))  # byte offset of every character
        text_bytes = np.diff(char_byte[np.append(0, np.cumsum(lengths))])
        if not np.array_equal(token_bytes, text_bytes):
            return None
        char_of_byte = np.cumsum(char_starts) - 1
        ends = np.cumsum(byte_length)
        starts = ends - byte_length
        return TokenSpans(flat_ids, char_of_byte[starts], char_of_byte[ends - 1] + 1, counts)


_BYTE_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _byte_table(tokenizer: PreTrainedTokenizerBase) -> _ByteTable | None:
    """The :class:`_ByteTable` of a byte-level BPE tokenizer that can use one, else ``None``."""
    try:
        return _BYTE_TABLES[tokenizer]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable
        return None
    backend = _fast_path_backend(tokenizer)
    table = None
    if backend is not None:
        config = json.loads(backend.to_str())
        model, normalizer = config.get("model") or {}, config.get("normalizer")
        vocab = backend.get_vocab(with_added_tokens=False)
        if (
            model.get("type") == "BPE"
            and not model.get("byte_fallback")
            and not model.get("dropout")
            and (normalizer is None or normalizer.get("type") == "NFC")
            and _ends_in_byte_level(config.get("pre_tokenizer"))
            and _keeps_offsets(config.get("post_processor"))
            and all(byte in vocab for byte in pre_tokenizers.ByteLevel.alphabet())  # every byte a token
        ):
            table = _ByteTable(tokenizer, vocab, nfc=normalizer is not None)
    _BYTE_TABLES[tokenizer] = table
    return table
