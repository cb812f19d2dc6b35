"""The model's tokenizer: loading it (plus ``model.new_tokens_file``) and what its pieces are.

New tokens are appended to the tokenizer; :func:`mlm_adapt.model.loading.extend_embeddings` gives each new
embedding row the mean of the embeddings of the pieces the old tokenizer split the token into.

The pieces: the ordinary tokens random replacements draw from, readable piece text, and the tokens that
open and close a block. Tokenizer families are told apart by the fast tokenizer's pipeline
(``backend_tokenizer``), not by the model's name, so a new checkpoint of a known family needs nothing:

- **WordPiece** (BERT, RoBERTa-wwm, MacBERT, ELECTRA): continuation pieces start with the model's
  ``continuing_subword_prefix`` (``##``); unused slots are ``[unused12]``-style bracketed names.
- **SentencePiece / Metaspace** (XLM-R, ALBERT, DeBERTa-v2/v3, mT5-style Unigram or BPE): a word-start marker
  ``▁`` prefixes pieces; with byte fallback, bytes are pieces ``<0xE6>``.
- **Byte-level BPE** (GPT-2/Qwen2-style, used by ModernBERT): pieces are byte sequences written with GPT-2's
  byte-to-unicode table (``æĺ¯`` is ``是``); a piece may hold part of a character's UTF-8 bytes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.loads import pretrained_tokenizer

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


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's inverse byte-to-unicode table: the character a byte-level piece uses for each byte."""
    printable = {
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    }
    others = [b for b in range(256) if b not in printable]  # written as chr(256), chr(257)... in order
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}


def piece_bytes(piece: str) -> bytes | None:
    """The bytes a byte-level piece stands for, ``None`` if it is not written with the byte table."""
    table = _byte_decoder()
    try:
        return bytes(table[ch] for ch in piece)
    except KeyError:
        return None


def ordinary_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Sorted ids random replacements are drawn from: pieces that stand for text on their own.

    Rule, in every family: no special token (``all_special_ids``), no bracketed name (``[unused3]``,
    ``<extra_id_0>``), no piece that is only whitespace. Per family:

    - WordPiece: no continuation piece (``##`` prefix): it cannot stand at the start of a word;
    - SentencePiece/Metaspace: no bare ``▁`` (a word-start marker, not text) and no byte-fallback piece
      ``<0xE6>`` (one byte of a character);
    - byte-level BPE: only pieces whose bytes decode as whole UTF-8 characters (``æĺ¯`` = ``是`` is
      kept, a piece holding one or two of its three bytes is not).

    Tokens added to the vocabulary (``data.new_tokens_file``) are ordinary words and are kept.

    Raises:
        MLMAdaptError: If no token is left.
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
            "replacements from; set data.random_replace_prob=0"
        )
    return sorted(ids)


def piece_text(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str:
    """One token as readable text: ``是`` for ``æĺ¯``, ``▁``/``Ġ`` word starts as a space.

    WordPiece pieces are shown as they are (``##s``: a continuation is informative); special tokens by
    name; a byte-level or byte-fallback piece that is only part of a character as ``<0xE6>`` per byte.
    """
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
    """The ids that open and close a block: the tokenizer's ``cls``/``sep``, else its ``bos``/``eos``.

    Raises:
        MLMAdaptError: If the tokenizer has neither pair.
    """
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
    tokenizer is never paired with a model whose vocabulary was resized for new tokens it lacks.

    Args:
        name_or_path: Hub name or local directory of the model or tokenizer.
        new_tokens_file: Tokens added to the vocabulary, one per line (``model.new_tokens_file``).
        key: The option that named ``name_or_path``, for error messages.
    """
    tokenizer = pretrained_tokenizer(name_or_path, key)
    if new_tokens_file:
        extend_tokenizer(tokenizer, read_new_tokens(new_tokens_file))
    return tokenizer
