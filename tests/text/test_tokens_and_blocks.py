import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlm_adapt.text.alignment import tokenize_with_word_ids
from mlm_adapt.text.blocks import SPECIAL_WORD_ID, build_blocks
from mlm_adapt.text.segmentation import JiebaSegmenter


def test_word_ids_group_chinese_words_and_english_pieces(tokenizer):
    out = tokenize_with_word_ids(["我喜欢北京 iphone 2023年"], tokenizer, JiebaSegmenter())
    tokens = tokenizer.convert_ids_to_tokens(out["input_ids"][0])
    word_ids = out["word_ids"][0]
    groups: dict[int, list[str]] = {}
    for token, word in zip(tokens, word_ids, strict=True):
        groups.setdefault(word, []).append(token)
    words = ["".join(t.removeprefix("##") for t in group) for group in groups.values()]
    assert words == ["我", "喜欢", "北京", "iphone", "2023", "年"]
    assert SPECIAL_WORD_ID not in word_ids  # no special tokens are added at this stage


def _docs(draw_lengths):
    """Synthetic documents: token ids 10.. with words of the given lengths."""
    ids, wids = [], []
    for lengths in draw_lengths:
        doc_ids, doc_wids = [], []
        for word, length in enumerate(lengths):
            doc_ids += [10 + word % 50] * length
            doc_wids += [word] * length
        ids.append(doc_ids)
        wids.append(doc_wids)
    return ids, wids


doc_strategy = st.lists(st.lists(st.integers(1, 6), min_size=0, max_size=30), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(docs=doc_strategy, max_len=st.integers(8, 40), packing=st.booleans())
def test_blocks_keep_every_token_and_never_split_short_words(docs, max_len, packing):
    ids, wids = _docs(docs)
    out = build_blocks(ids, wids, max_len, cls_token_id=2, sep_token_id=3, packing=packing)
    content = []
    for block, block_wids in zip(out["input_ids"], out["word_ids"], strict=True):
        assert len(block) <= max_len and block[0] == 2 and block[-1] == 3
        inner = np.asarray(block_wids[1:-1])
        words = inner[inner >= 0]
        # compact and increasing: 0..k-1 in order of appearance
        assert sorted(set(words.tolist())) == list(range(len(set(words.tolist()))))
        assert np.all(np.diff(words) >= 0)
        content += [t for t in block[1:-1] if t != 3]
    # no text is dropped: all tokens survive, in order
    assert content == [t for doc in ids for t in doc]
    # a word that fits in a block is never cut by a block edge
    word_lengths = [[w for w in doc] for doc in docs]
    longest = max((x for doc in word_lengths for x in doc), default=0)
    if longest <= max_len - 2:
        total_words = sum(len(doc) for doc in docs)
        seen_words = sum(len(set(w for w in b[1:-1] if w >= 0)) for b in out["word_ids"])
        assert seen_words == total_words


def test_line_by_line_splits_a_long_line_into_several_examples():
    ids, wids = _docs([[2] * 30, [1, 1]])
    out = build_blocks(ids, wids, 16, cls_token_id=2, sep_token_id=3, packing=False)
    assert [len(b) for b in out["input_ids"]] == [16, 16, 16, 16, 6, 4]  # 60 tokens = 4 x 14 + 4
    assert all(3 not in b[1:-1] for b in out["input_ids"])  # documents are not joined


def test_packing_joins_documents_with_sep_and_distinct_word_ids():
    ids, wids = _docs([[1, 1], [1, 1]])
    out = build_blocks(ids, wids, 16, cls_token_id=2, sep_token_id=3, packing=True)
    assert out["input_ids"] == [[2, 10, 11, 3, 10, 11, 3]]
    assert out["word_ids"] == [[-1, 0, 1, -1, 2, 3, -1]]


def test_a_word_longer_than_a_block_is_cut():
    ids, wids = _docs([[20]])
    out = build_blocks(ids, wids, 10, cls_token_id=2, sep_token_id=3, packing=True)
    assert [len(b) - 2 for b in out["input_ids"]] == [8, 8, 4]


def test_rejects_blocks_too_short_for_specials():
    with pytest.raises(ValueError):
        build_blocks([[1]], [[0]], 2, cls_token_id=2, sep_token_id=3, packing=True)
