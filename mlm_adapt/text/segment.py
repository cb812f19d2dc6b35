"""Jieba-compatible Chinese word segmentation with two interchangeable backends (the default segmenters).

``rjieba`` (Rust, jieba-rs) and ``jieba`` (pure Python) share jieba's dictionary and, with the HMM for
unknown words switched off, produce identical segmentations; rjieba is about an order of magnitude faster.
A :class:`Segmenter` is picklable and builds its backend lazily, once per process, so it can be shipped to
``datasets.map`` workers and DataLoader workers without rebuilding the dictionary for every call.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Literal

import rjieba

from mlm_adapt.errors import MLMAdaptError

SegmenterBackend = Literal["rjieba", "jieba"]

# rjieba keeps frequencies (and their total) in 64-bit integers; far below that, any word already wins.
MAX_FREQUENCY = 10**12


def jieba_cache_dir() -> Path:
    """jieba's prefix-dictionary cache dir: ``$MLM_ADAPT_JIEBA_CACHE`` or ``~/.cache/mlm_adapt/jieba``.

    jieba's default is ``jieba.cache`` in the system temp directory, shared by every user of a node: a file
    left there by another user cannot be replaced (every process then rebuilds the dictionary) and would be
    unmarshalled without question. A private directory, written once per node by ``prepare_data`` (jieba
    writes it atomically), lets every rank and worker just load it.
    """
    path = Path(os.environ.get("MLM_ADAPT_JIEBA_CACHE") or Path.home() / ".cache" / "mlm_adapt" / "jieba")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def read_user_dict(path: str | Path) -> list[tuple[str, int | None, str | None]]:
    """Parses a jieba user dictionary: one ``word [freq] [tag]`` entry per line.

    Args:
        path: The dictionary file (UTF-8).

    Returns:
        ``(word, freq, tag)`` triples; ``freq`` and ``tag`` are ``None`` when the line omits them.
    """
    path = Path(path)
    if not path.is_file():
        raise MLMAdaptError(f"data.user_dict: {path} does not exist; give a jieba dictionary file or null")
    entries = []
    for lineno, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8").strip().lstrip("\ufeff")
        except UnicodeDecodeError:
            raise MLMAdaptError(
                f"data.user_dict: {path} line {lineno} is not UTF-8; re-save the dictionary as UTF-8"
            ) from None
        if not line:
            continue
        parts = line.split()
        word, freq, tag = parts[0], None, None
        if len(parts) > 1:
            if not parts[1].isdigit():
                raise MLMAdaptError(
                    f"data.user_dict: {path} line {lineno}: frequency {parts[1]!r} is not an integer; "
                    "use 'word [freq] [tag]'"
                )
            freq = int(parts[1])
            if freq > MAX_FREQUENCY:
                raise MLMAdaptError(
                    f"data.user_dict: {path} line {lineno}: frequency {parts[1]} is too large; use at most "
                    f"{MAX_FREQUENCY} (jieba's own dictionary tops out below 10^6)"
                )
        if len(parts) > 2:
            tag = parts[2]
        entries.append((word, freq, tag))
    return entries


class Segmenter:
    """Splits text into words with jieba's dictionary (precise mode).

    Args:
        backend: ``rjieba`` (fast, Rust) or ``jieba`` (reference Python implementation).
        hmm: Use jieba's HMM to join unknown characters into new words. Off by default: with it off both
            backends agree exactly, and dictionary words are what whole-word masking should mask.
        user_dict: Optional jieba user dictionary (``word [freq] [tag]`` per line), applied to either backend.
    """

    def __init__(self, backend: SegmenterBackend = "rjieba", hmm: bool = False, user_dict: str | None = None):
        if backend not in ("rjieba", "jieba"):
            raise MLMAdaptError(f"data.segmenter: unknown backend {backend!r}; use 'rjieba' or 'jieba'")
        self.backend = backend
        self.hmm = hmm
        self.user_dict = user_dict
        self._entries = read_user_dict(user_dict) if user_dict else []
        # Pickled with the segmenter: datasets' cache fingerprint changes when the dictionary content does.
        self.user_dict_sha1 = hashlib.sha1(repr(self._entries).encode()).hexdigest() if user_dict else None
        self._impl = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_impl"] = None
        return state

    def _build(self):
        if self.backend == "rjieba":
            impl = rjieba.Jieba()
            for word, freq, tag in self._entries:
                impl.add_word(word, freq, tag)
            return impl.cut
        import jieba  # noqa: PLC0415 (the reference backend: a slow import, only when chosen)

        jieba.setLogLevel(logging.WARNING)
        impl = jieba.Tokenizer()
        impl.tmp_dir = str(jieba_cache_dir())
        impl.initialize()
        for word, freq, tag in self._entries:
            impl.add_word(word, freq, tag)
        return lambda text, hmm: impl.lcut(text, HMM=hmm)

    def __call__(self, text: str) -> list[str]:
        """Returns the words of ``text`` in order; joined they give ``text`` back."""
        return self.segment([text])[0]

    def segment(self, texts: list[str]) -> list[list[str]]:
        """The words of each text (the :class:`~mlm_adapt.text.word_segmenter.WordSegmenter` protocol)."""
        if self._impl is None:
            self._impl = self._build()
        cut, hmm = self._impl, self.hmm
        return [cut(text, hmm) for text in texts]

    def __repr__(self) -> str:
        return f"Segmenter(backend={self.backend!r}, hmm={self.hmm}, user_dict={self.user_dict!r})"
