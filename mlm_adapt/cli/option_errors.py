"""One line, not jsonargparse's union report, for a bad ``data.segmenter`` or ``data.opencc``.

Both options are unions (a built-in name or a class path; an OpenCC configuration or null), for which
jsonargparse prints the usage and a dozen lines about every union member. The user needs one line: which
value, why, and what is accepted.
"""

from __future__ import annotations

import re
from typing import NoReturn

from lightning.pytorch.cli import LightningArgumentParser
from typing_extensions import override

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.segmentation import BUILTIN_NAMES, OPENCC_CONFIGS

_GIVEN = re.compile(r"Given value: (.*)")
_CLASS_PATH = re.compile(r"Problem with given class_path '([^']*)':\s*\n\s*(.+)")
# jsonargparse names the class only when the value is a mapping; a class path string is the given value.
_NOT_A_SEGMENTER = re.compile(r"Import path (?:(\S+) )?does not implement protocol")


def option_error_line(message: str) -> str | None:
    """The one-line error for a parser message about ``data.segmenter``/``data.opencc`` (else ``None``)."""
    given = _GIVEN.search(message)
    value = given.group(1).strip() if given else "?"
    if 'Parser key "data.segmenter"' in message:
        names = ", ".join(BUILTIN_NAMES)
        accepted = f"use a built-in name ({names}) or the class_path of a class with segment(texts)"
        not_a_segmenter = _NOT_A_SEGMENTER.search(message)
        if not_a_segmenter:
            path = not_a_segmenter.group(1) or value
            return f"data.segmenter: {path} has no segment(texts) method; {accepted}"
        problem = _CLASS_PATH.search(message)
        if problem:
            path, reason = problem.group(1), problem.group(2).strip()
            return f"data.segmenter: cannot use class_path {path!r} ({reason}); {accepted}"
        return f"data.segmenter: unknown segmenter {value!r}; {accepted}"
    if 'Parser key "data.opencc"' in message:
        configs = ", ".join(OPENCC_CONFIGS)
        return f"data.opencc: unknown OpenCC configuration {value!r}; use one of {configs} or null"
    return None


class MLMAdaptArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, with one-line errors for the union-typed options above."""

    @override
    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        line = option_error_line(message)
        if line is None:
            super().error(message, ex)
        # An MLMAdaptError reaches the CLI's one error boundary (mlm_adapt.cli.commands), whatever the
        # parser's exit_on_error.
        raise MLMAdaptError(line)
