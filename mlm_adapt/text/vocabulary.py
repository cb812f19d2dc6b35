"""What a tokenizer's pieces are: the ordinary tokens random replacements draw from, readable piece text,
and the tokens that open and close a block.

Tokenizer families are told apart by the fast tokenizer's pipeline (``backend_tokenizer``), not by the
model's name, so a new checkpoint of a known family needs nothing:

- **WordPiece** (BERT, RoBERTa-wwm, MacBERT, ELECTRA): continuation pieces start with the model's
  ``continuing_subword_prefix`` (``##``); unused slots are ``[unused12]``-style bracketed names.
- **SentencePiece / Metaspace** (XLM-R, ALBERT, DeBERTa-v2/v3, mT5-style Unigram or BPE): a word-start marker
  ``▁`` prefixes pieces; with byte fallback, bytes are pieces ``<0xE6>``.
- **Byte-level BPE** (GPT-2/Qwen2-style, used by ModernBERT): pieces are byte sequences written with GPT-2's
  byte-to-unicode table (``æĺ¯`` is ``是``); a piece may hold part of a character's UTF-8 bytes.

No torch import here: this module belongs to the text layer.
"""

from __future__ import annotations

import functools
import re

from transformers import PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError

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
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


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
