"""Traditional Chinese: segment an OpenCC-converted (Simplified) copy, keep the original characters.

jieba's dictionary (and most segmenters' models) is Simplified: on Taiwan or Hong Kong text it splits most
words into characters. ``data.opencc: t2s`` (``tw2s``, ``hk2s``) converts each text to Simplified for the
segmenter only; the word boundaries found there are mapped back to the original text by character
position, so the training text, tokens and exports stay Traditional.

Mapping by position needs a conversion that keeps every character in place. OpenCC's character tables do
(one character for one); its phrase tables almost always do too, but a phrase may change length (Taiwan
phrases such as 網際網路 -> 互联网 under ``tw2sp``). A text whose conversion changes length is converted
character by character instead: it loses the phrase context (rare characters with several Simplified
forms) but keeps every boundary in place.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Literal, get_args

from mlm_adapt.errors import MLMAdaptError

OpenCCConfig = Literal["t2s", "tw2s", "hk2s"]
OPENCC_CONFIGS: tuple[str, ...] = get_args(OpenCCConfig)


class ChineseConverter:
    """OpenCC conversion that keeps every character at its position (see the module docstring).

    Args:
        config: The OpenCC configuration: ``t2s`` (Traditional), ``tw2s`` (Taiwan), ``hk2s`` (Hong Kong).
    """

    def __init__(self, config: str) -> None:
        if config not in OPENCC_CONFIGS:
            raise MLMAdaptError(
                f"data.opencc: unknown OpenCC configuration {config!r}; use one of "
                f"{', '.join(OPENCC_CONFIGS)} (to Simplified) or null"
            )
        self.config = config
        self._opencc: Any = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_opencc": None}

    def _converter(self) -> Any:
        if self._opencc is None:
            try:
                import opencc  # noqa: PLC0415 (optional dependency, only with data.opencc)
            except ImportError:
                raise MLMAdaptError(
                    "data.opencc needs the opencc package; "
                    "install it with: pip install 'mlm_adapt[segmenters]'"
                ) from None
            try:
                self._opencc = opencc.OpenCC(self.config)
            except RuntimeError as exc:  # the configuration file is missing from the installed package
                raise MLMAdaptError(f"data.opencc: OpenCC cannot load {self.config!r}: {exc}") from None
        return self._opencc

    def convert(self, text: str) -> str:
        """``text`` converted, character for character (same length, same positions)."""
        converted = self._converter().convert(text)
        if len(converted) == len(text):
            return converted
        return "".join(self._convert_char(ch) for ch in text)

    def _convert_char(self, ch: str) -> str:
        return _char_conversion(self._converter(), ch)


@lru_cache(maxsize=65536)
def _char_conversion(converter: Any, ch: str) -> str:
    converted = converter.convert(ch)
    return converted if len(converted) == 1 else ch


def split_like(text: str, words: list[str]) -> list[str]:
    """``text`` cut at the same positions as ``words`` (words of a same-length converted copy)."""
    pieces, pos = [], 0
    for word in words:
        pieces.append(text[pos : pos + len(word)])
        pos += len(word)
    return pieces
