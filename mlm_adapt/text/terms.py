"""Domain vocabulary report: characters the tokenizer lacks and terms the word segmenter splits.

- Which characters does the model's vocabulary lack? Their tokens become ``[UNK]`` and can never be
  predicted; the most frequent ones are candidates for ``model.new_tokens_file``.
- Which domain terms does the configured segmenter (``data.segmenter``) split? Whole-word masking masks its
  words, so a term it splits is never masked as a whole. Candidates are the multi-character words that
  jieba's HMM joins from unknown characters, kept when the segmenter splits most of their occurrences and
  their parts rarely occur apart (:func:`cohesion`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import rjieba
from transformers import PreTrainedTokenizerBase

from mlm_adapt.guard.outputs import Output, write_text
from mlm_adapt.text.segmentation import Segmenter, WordSegmenter, read_user_dict


def oov_characters(texts: Iterable[str], tokenizer: PreTrainedTokenizerBase) -> tuple[Counter, int, int]:
    """Counts the characters the tokenizer maps to ``[UNK]``.

    Returns:
        ``(oov_counts, unk_tokens, total_tokens)`` over ``texts``.
    """
    texts = list(texts)
    chars = Counter(ch for text in texts for ch in text if not ch.isspace())
    distinct = list(chars)
    unk = tokenizer.unk_token_id
    ids = tokenizer(distinct, add_special_tokens=False)["input_ids"] if distinct else []
    oov = Counter({ch: chars[ch] for ch, piece in zip(distinct, ids, strict=True) if piece == [unk]})
    unk_tokens = total = 0
    for start in range(0, len(texts), 1000):
        for row in tokenizer(texts[start : start + 1000], add_special_tokens=False)["input_ids"]:
            total += len(row)
            unk_tokens += sum(1 for i in row if i == unk)
    return oov, unk_tokens, total


def _is_cjk(word: str) -> bool:
    return all("\u4e00" <= ch <= "\u9fff" for ch in word)


def cohesion(term: str, corpus: str) -> float:
    """Least pointwise mutual information (natural log) over the ways to split ``term`` in two.

    High for terms whose parts rarely occur apart (``标间``, hotel jargon), low for chance combinations of
    frequent words (``这是``), which the HMM also joins.
    """
    n, joint = max(len(corpus), 1), max(corpus.count(term), 1)
    return min(
        math.log(joint * n / (max(corpus.count(term[:i]), 1) * max(corpus.count(term[i:]), 1)))
        for i in range(1, len(term))
    )


def candidate_terms(
    texts: Iterable[str],
    user_dict: str | None = None,
    min_count: int = 5,
    min_cohesion: float = 3.0,
    segmenter: WordSegmenter | None = None,
) -> Counter:
    """Multi-character Chinese words that jieba's HMM finds in ``texts`` and the segmenter mostly splits.

    Args:
        texts: The domain corpus.
        user_dict: A jieba user dictionary already in use (its words count as known).
        min_count: Keep terms seen at least this often.
        min_cohesion: Keep terms whose :func:`cohesion` is at least this (``e**3 = 20`` times more often
            together than by chance by default).
        segmenter: The segmenter whole-word masking uses (``data.segmenter``); a term it keeps whole in at
            least half of its occurrences is known. Default: rjieba with ``user_dict``.
    """
    dictionary = rjieba.Jieba()
    for word, freq, tag in read_user_dict(user_dict) if user_dict else []:
        dictionary.add_word(word, freq, tag)
    texts = list(texts)
    counts = Counter(w for text in texts for w in dictionary.cut(text, True) if len(w) > 1 and _is_cjk(w))
    counts = Counter({w: c for w, c in counts.items() if c >= min_count})
    segmenter = segmenter or Segmenter("rjieba", user_dict=user_dict)
    kept_whole = Counter(w for words in segmenter.segment(texts) for w in words if w in counts)
    counts = Counter({w: c for w, c in counts.items() if 2 * kept_whole[w] < c})
    corpus = "\n".join(texts)
    return Counter({w: c for w, c in counts.items() if cohesion(w, corpus) >= min_cohesion})


def write_user_dict(terms: Counter, path: str | Path | Output) -> None:
    """Writes terms one per line, without a frequency: jieba then suggests one that keeps each term whole.

    Args:
        terms: Terms and their counts (most common first).
        path: The file, or an :class:`~mlm_adapt.guard.outputs.Output` carrying the run's inputs.
    """
    output = path if isinstance(path, Output) else Output(path, key="output_dict", directory=False)
    write_text(output, "".join(f"{w}\n" for w, _ in terms.most_common()))
