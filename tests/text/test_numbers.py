"""The one parser of numbers read from users' text files: plain decimals in, one line for anything else."""

from __future__ import annotations

import pytest

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.numbers import parse_number


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [
        ("12", int, 12),
        (" 7 ", int, 7),
        ("１０", int, 10),
        ("٣", int, 3),
        ("4.5", float, 4.5),
        ("-1e3", float, -1e3),
    ]
    + [(".5", float, 0.5), (3.0, int, 3), (2, float, 2.0)],
)
def test_plain_decimals_in_any_scripts_digits_are_numbers(value, kind, expected):
    number = parse_number(value, kind, "f {value}", "hint")
    assert number == expected and type(number) is kind


@pytest.mark.parametrize(
    "value",
    ["", "²", "½", "五", "12abc", "1_000", "nan", "inf", "-inf", "0x10", "1e400", None, True, [1], 2.5],
)
def test_anything_else_is_one_line_naming_the_field(value):
    kind = int if value == 2.5 else float if value == "1e400" else int
    with pytest.raises(MLMAdaptError) as caught:
        parse_number(value, kind, "terms.txt line 3: frequency {value}", "use digits")
    message = str(caught.value)
    assert message.startswith("terms.txt line 3: frequency ") and message.endswith("; use digits")
    assert "\n" not in message


def test_range_is_checked():
    with pytest.raises(MLMAdaptError, match="frequency 11 is too large: at most 10; h"):
        parse_number("11", int, "frequency {value}", "h", maximum=10)
    with pytest.raises(MLMAdaptError, match="frequency -1 is below 0; h"):
        parse_number("-1", int, "frequency {value}", "h", minimum=0)
