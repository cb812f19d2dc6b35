"""The one parser of numbers read from a user's text files (a dictionary's frequencies, a task's regression
labels): what counts as a number, and one line naming the file, line and value when it is not one.

Python's ``int``/``float`` accept more than a user means (``1_000``, ``" 3 "``) and fail on characters that
look like digits but are none (``²``, ``½``, ``五``) with an exception, not a message. Here a number is a
plain decimal: an optional sign, digits, for ``float`` an optional fraction and exponent. Decimal digits of
any script count (full-width ``１０`` is 10, as a Chinese input method writes it); superscripts, fractions
and numerals written as words do not.
"""

from __future__ import annotations

import math
import re
import unicodedata

from mlm_adapt.errors import MLMAdaptError

_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
# Full-width signs, point and exponent, as a Chinese input method writes them.
_WIDE = str.maketrans({"＋": "+", "－": "-", "．": ".", "ｅ": "e", "Ｅ": "E"})


def _ascii_digits(text: str) -> str:
    """``text`` with every decimal digit (any script, category Nd) as its ASCII digit."""
    return "".join(str(unicodedata.decimal(ch)) if unicodedata.category(ch) == "Nd" else ch for ch in text)


def parse_number(
    value: object,
    kind: type[int] | type[float],
    what: str,
    hint: str,
    minimum: float | None = None,
    maximum: float | None = None,
) -> int | float:
    """``value`` (a field as read from a file; a number a reader already decoded passes as it is) as an
    ``int`` or a finite ``float`` (``kind``) within ``[minimum, maximum]``.

    Args:
        value: The field (surrounding whitespace is ignored); ``bool`` and other types are no number.
        kind: ``int`` (digits only) or ``float`` (also a fraction and an exponent; never NaN or infinite).
        what: The value's description for the message, ``{value}`` where the value goes:
            ``data.segmentation.user_dict: terms.txt line 3: frequency {value}``.
        hint: How to write it instead, ending the message.
        minimum: The least value accepted, if any.
        maximum: The largest value accepted, if any.

    Raises:
        MLMAdaptError: One line: ``{what} is not a number (digits 0-9); {hint}``, or out of range.
    """
    noun = "an integer" if kind is int else "a number"
    number: int | float | None = None
    if isinstance(value, str):
        plain = _ascii_digits(value.strip()).translate(_WIDE)
        if (_INTEGER if kind is int else _DECIMAL).fullmatch(plain):
            number = int(plain) if kind is int else float(plain)
    elif (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (kind is float or float(value).is_integer())
    ):
        number = kind(value) if math.isfinite(value) else None
    if number is None:
        raise MLMAdaptError(f"{what.replace('{value}', repr(value))} is not {noun} (digits 0-9); {hint}")
    shown = what.replace("{value}", str(value).strip())
    if not math.isfinite(number):
        raise MLMAdaptError(f"{shown} is too large to be a number; {hint}")
    if minimum is not None and number < minimum:
        raise MLMAdaptError(f"{shown} is below {minimum:g}; {hint}")
    if maximum is not None and number > maximum:
        raise MLMAdaptError(f"{shown} is too large: at most {maximum:g}; {hint}")
    return number
