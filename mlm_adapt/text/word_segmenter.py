"""What a word segmenter is: any object with ``segment(texts) -> word lists`` whose words join back.

Whole-word masking needs, for every text, a list of words that concatenate back to the text exactly
(``"".join(words) == text``): the words are aligned to the tokenizer's own tokens by character position
(:mod:`mlm_adapt.text.alignment`). A segmenter need not subclass anything; ``data.segmenter`` takes a
jsonargparse ``class_path``/``init_args`` of any class with this method (see ``docs/segmenters.md``).

Segmenters that drop whitespace (pkuseg, snownlp) are wrapped by :func:`restore_whitespace`, which puts
each dropped run of whitespace back as a word of its own.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class WordSegmenter(Protocol):
    """Maps a batch of texts to their words.

    The words of each text must join back to it (``"".join(words) == text``), whitespace included; a
    segmenter is called from ``datasets.map`` worker processes, so it must pickle (load models lazily, on
    first use, and leave them out of the pickled state).
    """

    def segment(self, texts: list[str]) -> list[list[str]]:
        """The words of each text, in order."""
        ...


def class_path(obj: Any) -> str:
    """``module.QualifiedName`` of an object's class: how configs and fingerprints name a segmenter."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def restore_whitespace(text: str, words: list[str]) -> list[str] | None:
    """``words`` with the whitespace of ``text`` that the segmenter dropped put back as words of their own.

    Returns ``None`` when the words do not match the text apart from whitespace (the segmenter changed or
    dropped other characters): that is a violation to report, not something to repair.
    """
    if "".join(words) == text:
        return list(words)
    restored: list[str] = []
    pos = 0
    for word in words:
        start = pos
        while pos < len(text) and text[pos].isspace() and not text.startswith(word, pos):
            pos += 1
        if pos > start:
            restored.append(text[start:pos])
        if not text.startswith(word, pos):
            return None
        if word:
            restored.append(word)
        pos += len(word)
    if pos < len(text):
        if not text[pos:].isspace():
            return None
        restored.append(text[pos:])
    return restored
