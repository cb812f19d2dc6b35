"""``data.segmentation.opencc``: the Simplified copy of Traditional Chinese text that the segmenter sees, and
the word boundaries found in it mapped back onto the original text (an optional dependency: ``opencc``)."""

from __future__ import annotations

import itertools
from functools import lru_cache
from typing import Any, Literal, get_args

from mlm_adapt.errors import MLMAdaptError

EXTRA_HINT = "install it with: pip install 'mlm_adapt[segmenters]'"

OpenCCConfig = Literal["t2s", "tw2s", "hk2s"]
OPENCC_CONFIGS: tuple[str, ...] = get_args(OpenCCConfig)


class ChineseConverter:
    """``data.segmentation.opencc``: the Simplified copy of Traditional text that the segmenter sees.

    jieba's dictionary (and most segmenters' models) is Simplified: on Taiwan or Hong Kong text it splits
    most words into characters. The word boundaries found in the copy are mapped back to the original text
    by character position, so the training text, tokens and exports stay Traditional. OpenCC's character
    tables keep every character in place; a phrase that changes length (網際網路 -> 互联网 under ``tw2sp``)
    does not, so such a text is converted character by character instead (losing the phrase context).
    ``config``: ``t2s`` (Traditional), ``tw2s`` (Taiwan) or ``hk2s`` (Hong Kong) to Simplified.
    """

    def __init__(self, config: str) -> None:
        if config not in OPENCC_CONFIGS:
            raise MLMAdaptError(
                f"data.segmentation.opencc: unknown OpenCC configuration {config!r}; use one of "
                f"{', '.join(OPENCC_CONFIGS)} (to Simplified) or null"
            )
        self.config = config
        self._opencc: Any = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_opencc": None}

    def _converter(self) -> Any:
        if self._opencc is None:
            try:
                import opencc  # noqa: PLC0415 (optional dependency, only with data.segmentation.opencc)
            except ImportError:
                raise MLMAdaptError(
                    f"data.segmentation.opencc needs the opencc package; {EXTRA_HINT}"
                ) from None
            try:
                self._opencc = opencc.OpenCC(self.config)
            except RuntimeError as exc:  # the configuration file is missing from the installed package
                raise MLMAdaptError(
                    f"data.segmentation.opencc: OpenCC cannot load {self.config!r}: {exc}"
                ) from None
        return self._opencc

    def convert(self, text: str) -> str:
        """``text`` converted, character for character (same length, same positions)."""
        converter = self._converter()
        converted = converter.convert(text)
        if len(converted) == len(text):
            return converted
        return "".join(_char_conversion(converter, ch) for ch in text)


@lru_cache(maxsize=65536)
def _char_conversion(converter: Any, ch: str) -> str:
    converted = converter.convert(ch)
    return converted if len(converted) == 1 else ch


def split_like(text: str, words: list[str]) -> list[str]:
    """``text`` cut at the same positions as ``words`` (words of a same-length converted copy)."""
    bounds = [0, *itertools.accumulate(map(len, words))]
    return [text[start:end] for start, end in itertools.pairwise(bounds)]
