"""jieba's dictionary cache: private to the user, built once, then only loaded by other processes."""

from __future__ import annotations

import pickle
import stat

from mlm_adapt.text.segmentation import JiebaSegmenter


def test_jieba_cache_is_private_built_once_and_reused(tmp_path, monkeypatch):
    cache_dir = tmp_path / "jieba"
    monkeypatch.setenv("MLM_ADAPT_JIEBA_CACHE", str(cache_dir))
    first = JiebaSegmenter("jieba")
    words = first("我们在北京大学学习自然语言处理")
    cache = cache_dir / "jieba.cache"
    assert cache.is_file(), "jieba wrote its cache to the shared system temp dir"
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700
    built = cache.stat().st_mtime_ns
    # What a DataLoader/datasets worker gets: a pickled segmenter that builds its backend lazily.
    clone = pickle.loads(pickle.dumps(first))
    assert clone._impl is None
    assert clone("我们在北京大学学习自然语言处理") == words
    assert cache.stat().st_mtime_ns == built  # loaded from the cache, not rebuilt and rewritten
    assert [p.name for p in cache_dir.iterdir()] == ["jieba.cache"]  # no temp file left behind
