"""The model's tokenizer: loading it (plus ``model.new_tokens_file``), what its pieces are, and the ``vocab``
report of the domain's characters it lacks and terms the segmenter splits.

New tokens are appended to the tokenizer (:func:`mlm_adapt.model.loading.extend_embeddings` gives each new
embedding row the mean of the embeddings of its old pieces). Tokenizer families are told apart by the fast
tokenizer's pipeline (``backend_tokenizer``), not by the model's name, so a new checkpoint of a known
family needs nothing:

- **WordPiece** (BERT, RoBERTa-wwm, MacBERT, ELECTRA): continuation pieces start with the model's
  ``continuing_subword_prefix`` (``##``); unused slots are ``[unused12]``-style bracketed names.
- **SentencePiece / Metaspace** (XLM-R, ALBERT, DeBERTa-v2/v3, mT5-style Unigram or BPE): a word-start marker
  ``▁`` prefixes pieces; with byte fallback, bytes are pieces ``<0xE6>``.
- **Byte-level BPE** (GPT-2/Qwen2-style, used by ModernBERT): pieces are byte sequences written with GPT-2's
  byte-to-unicode table (``æĺ¯`` is ``是``); a piece may hold part of a character's UTF-8 bytes.

The report (``mlm_adapt vocab``): a character the vocabulary lacks becomes ``[UNK]`` and is never predicted
(the frequent ones are candidates for ``model.new_tokens_file``); a term the segmenter splits is never
masked as a whole by whole-word masking (candidates for a jieba user dictionary).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.loads import pretrained_tokenizer
from mlm_adapt.guard.outputs import Output, write_text
from mlm_adapt.text.segmentation import JiebaSegmenter, WordSegmenter

METASPACE = "▁"
_BYTE_FALLBACK = re.compile(r"<0x[0-9A-Fa-f]{2}>")
_BRACKETED = re.compile(r"\[[^\[\]]*\]|<[^<>]*>")


def tokenizer_family(tokenizer: PreTrainedTokenizerBase) -> str:
    """``wordpiece``, ``metaspace``, ``bytelevel`` or ``other``, from the fast tokenizer's pipeline."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "other"
    model = type(backend.model).__name__
    parts = f"{backend.pre_tokenizer!r} {backend.decoder!r}"
    if "ByteLevel" in parts:
        return "bytelevel"
    if model == "WordPiece":
        return "wordpiece"
    if "Metaspace" in parts or model == "Unigram":
        return "metaspace"
    return "other"


# GPT-2's byte-to-unicode table, inverted: printable bytes are written as themselves ("!".."~", "¡".."¬",
# "®".."ÿ"), the others as chr(256), chr(257)... in order.
_PRINTABLE = {*range(33, 127), *range(161, 173), *range(174, 256)}
_BYTE_OF = {chr(b): b for b in _PRINTABLE} | {
    chr(256 + n): b for n, b in enumerate(b for b in range(256) if b not in _PRINTABLE)
}


def piece_bytes(piece: str) -> bytes | None:
    """The bytes a byte-level piece stands for, ``None`` if it is not written with the byte table."""
    try:
        return bytes(_BYTE_OF[ch] for ch in piece)
    except KeyError:
        return None


def ordinary_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Sorted ids random replacements are drawn from: pieces that stand for text on their own.

    Never a special token, a bracketed name (``[unused3]``, ``<extra_id_0>``) or a whitespace-only piece;
    nor a WordPiece continuation (it cannot start a word), a bare ``▁`` or a byte-fallback piece ``<0xE6>``,
    or a byte-level piece that is not whole UTF-8 characters (``æĺ¯`` = ``是`` is kept, a piece with one or
    two of its three bytes is not). Added tokens (``data.new_tokens_file``) are kept. None left is an error.
    """
    family = tokenizer_family(tokenizer)
    special = set(tokenizer.all_special_ids)
    prefix = "##"
    if family == "wordpiece":
        prefix = getattr(tokenizer.backend_tokenizer.model, "continuing_subword_prefix", "##") or "##"
    ids = []
    for token, index in tokenizer.get_vocab().items():
        if index in special or _BRACKETED.fullmatch(token):
            continue
        if family == "wordpiece" and token.startswith(prefix):
            continue
        if family == "metaspace" and (token.replace(METASPACE, "") == "" or _BYTE_FALLBACK.fullmatch(token)):
            continue
        text = token
        if family == "bytelevel":
            raw = piece_bytes(token)
            try:
                text = raw.decode("utf-8") if raw is not None else token
            except UnicodeDecodeError:
                continue
        if not text.strip():
            continue
        ids.append(index)
    if not ids:
        raise MLMAdaptError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no ordinary tokens to draw random "
            "replacements from; set data.masking.random_replace_prob=0"
        )
    return sorted(ids)


def piece_text(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str:
    """One token as readable text: ``是`` for ``æĺ¯``, ``▁``/``Ġ`` word starts as a space; WordPiece pieces
    (``##s``) and special tokens as they are; part of a character's bytes as ``<0xE6>`` per byte."""
    token = tokenizer.convert_ids_to_tokens(token_id)
    if token is None:
        return f"<{token_id}>"
    if token_id in set(tokenizer.all_special_ids):
        return token
    family = tokenizer_family(tokenizer)
    if family == "metaspace":
        return token.replace(METASPACE, " ")
    if family == "bytelevel":
        raw = piece_bytes(token)
        if raw is None:
            return token
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "".join(f"<0x{b:02X}>" for b in raw)
    return token


def join_pieces(tokenizer: PreTrainedTokenizerBase, token_ids: list[int]) -> str:
    """Consecutive tokens as text: the tokenizer's own decoding, without spaces between Chinese characters.

    Special tokens are kept (``[MASK]``, ``<mask>``). WordPiece's decoder puts a space between every two
    tokens (``北 京``); here a space separates only two ASCII letters/digits, as in the original text.
    """
    if tokenizer_family(tokenizer) != "wordpiece":
        return tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    text = ""
    for token in tokenizer.convert_ids_to_tokens(token_ids):
        if token.startswith("##"):
            text += token[2:]
        elif (
            text and text[-1].isascii() and text[-1].isalnum() and token[:1].isascii() and token[:1].isalnum()
        ):
            text += " " + token
        else:
            text += token
    return text


def block_special_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, int]:
    """The ids that open and close a block: the tokenizer's ``cls``/``sep``, else its ``bos``/``eos`` (an
    error if it has neither pair)."""
    start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    end = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    if start is None or end is None:
        raise MLMAdaptError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no cls/sep (or bos/eos) token to "
            "delimit blocks; use a masked-LM tokenizer"
        )
    return start, end


def read_new_tokens(path: str | Path) -> list[str]:
    """Reads a new-tokens file: one token per line (blank lines and duplicates ignored), UTF-8."""
    path = Path(path)
    if not path.is_file():
        raise MLMAdaptError(
            f"model.new_tokens_file: {path} does not exist; give a file with one token per line"
        )
    tokens = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return list(dict.fromkeys(t for t in tokens if t))


def extend_tokenizer(tokenizer: PreTrainedTokenizerBase, tokens: Sequence[str]) -> list[str]:
    """Adds the tokens missing from ``tokenizer``'s vocabulary, in order; returns those added."""
    vocab = tokenizer.get_vocab()
    new = [t for t in tokens if t not in vocab]
    tokenizer.add_tokens(new)
    return new


def load_tokenizer(
    name_or_path: str, new_tokens_file: str | None = None, key: str = "model.model_name_or_path"
) -> PreTrainedTokenizerBase:
    """The tokenizer of a model (Hub name or directory), extended with ``new_tokens_file`` when given.

    Every place that needs a run's tokenizer (data, model, export, fill-mask) goes through here, so a
    tokenizer is never paired with a model whose vocabulary was resized for new tokens it lacks. ``key`` is
    the option that named ``name_or_path``, for error messages.
    """
    tokenizer = pretrained_tokenizer(name_or_path, key)
    if new_tokens_file:
        extend_tokenizer(tokenizer, read_new_tokens(new_tokens_file))
    return tokenizer


def oov_characters(texts: Iterable[str], tokenizer: PreTrainedTokenizerBase) -> tuple[Counter, int, int]:
    """Counts the characters the tokenizer maps to ``[UNK]``: ``(oov_counts, unk_tokens, total_tokens)``."""
    texts = list(texts)
    chars = Counter(ch for text in texts for ch in text if not ch.isspace())
    distinct = list(chars)
    unk = tokenizer.unk_token_id
    ids = tokenizer(distinct, add_special_tokens=False)["input_ids"] if distinct else []
    oov = Counter({ch: chars[ch] for ch, piece in zip(distinct, ids, strict=True) if piece == [unk]})
    unk_tokens = total = 0
    for start in range(0, len(texts), 1000):
        for row in tokenizer(texts[start : start + 1000], add_special_tokens=False)["input_ids"]:
            total += len(row)
            unk_tokens += sum(1 for i in row if i == unk)
    return oov, unk_tokens, total


def _is_cjk(word: str) -> bool:
    return all("\u4e00" <= ch <= "\u9fff" for ch in word)


def cohesion(term: str, corpus: str) -> float:
    """Least pointwise mutual information (natural log) over the ways to split ``term`` in two.

    High for terms whose parts rarely occur apart (``标间``, hotel jargon), low for chance combinations of
    frequent words (``这是``), which the HMM also joins.
    """
    n, joint = max(len(corpus), 1), max(corpus.count(term), 1)
    return min(
        math.log(joint * n / (max(corpus.count(term[:i]), 1) * max(corpus.count(term[i:]), 1)))
        for i in range(1, len(term))
    )


def candidate_terms(
    texts: Iterable[str],
    user_dict: str | None = None,
    min_count: int = 5,
    min_cohesion: float = 3.0,
    segmenter: WordSegmenter | None = None,
) -> Counter:
    """Multi-character Chinese words that jieba's HMM finds in ``texts`` and ``segmenter`` mostly splits.

    Kept: terms seen at least ``min_count`` times whose :func:`cohesion` is at least ``min_cohesion``
    (``e**3 = 20`` times more often together than by chance) and that ``segmenter``
    (``data.segmentation.segmenter``;
    default rjieba) keeps whole in fewer than half of their occurrences. The words of ``user_dict`` (a jieba
    dictionary already in use) count as known.
    """
    texts = list(texts)
    hmm_words = JiebaSegmenter("rjieba", hmm=True, user_dict=user_dict).segment(texts)
    counts = Counter(w for words in hmm_words for w in words if len(w) > 1 and _is_cjk(w))
    counts = Counter({w: c for w, c in counts.items() if c >= min_count})
    segmenter = segmenter or JiebaSegmenter("rjieba", user_dict=user_dict)
    kept_whole = Counter(w for words in segmenter.segment(texts) for w in words if w in counts)
    counts = Counter({w: c for w, c in counts.items() if 2 * kept_whole[w] < c})
    corpus = "\n".join(texts)
    return Counter({w: c for w, c in counts.items() if cohesion(w, corpus) >= min_cohesion})


def write_user_dict(terms: Counter, path: str | Path | Output) -> None:
    """Writes terms (most common first) one per line, without a frequency: jieba then suggests one that
    keeps each term whole. ``path`` may be an :class:`~mlm_adapt.guard.outputs.Output`."""
    output = path if isinstance(path, Output) else Output(path, key="output_dict", directory=False)
    write_text(output, "".join(f"{w}\n" for w, _ in terms.most_common()))
