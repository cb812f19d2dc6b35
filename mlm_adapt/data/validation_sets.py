"""Named validation sets: ``data.validation_files`` as a list (one set) or a mapping ``{name: files}``.

The first set is the primary one: its metrics keep the names ``val/*`` (checkpoint monitors, the export's
choice of checkpoint), the others are logged as ``val_<name>/*``. A set given as ``null`` is held out from
the training documents (``data.validation_split``), e.g. ``{domain: null, general: [general.txt]}``.
"""

from __future__ import annotations

import re

from mlm_adapt.errors import MLMAdaptError

ValidationFiles = list[str] | dict[str, list[str] | None] | None
# The name of the only set when ``data.validation_files`` is a list (or absent).
DEFAULT_SET = "validation"
_NAME = re.compile(r"^[A-Za-z0-9_]+$")


def _check_mapping(files: dict) -> None:
    if not files:
        raise MLMAdaptError(
            "data.validation_files: the mapping is empty; give {name: [files]} (null: the held-out split)"
        )
    for name, value in files.items():
        if not _NAME.match(str(name)):
            raise MLMAdaptError(
                f"data.validation_files: set name {name!r} must be letters, digits or _ "
                "(its metrics are logged as val_<name>/...)"
            )
        if value is not None and not value:
            raise MLMAdaptError(
                f"data.validation_files.{name} is empty; give files or globs, or null for the held-out "
                "split (data.validation_split)"
            )
    if sum(value is None for value in files.values()) > 1:
        raise MLMAdaptError(
            "data.validation_files: only one set can be null (held out from the training documents); "
            "give files for the others"
        )


class ValidationSets:
    """``data.validation_files``, checked: each set's name, files, ``DatasetDict`` split and config key.

    Args:
        files: Files or globs of one set, or ``{name: files}`` (``None``: the held-out split).

    Raises:
        MLMAdaptError: a set name that cannot be a metric prefix, a set without files, an empty mapping, or
            more than one held-out set.
    """

    def __init__(self, files: ValidationFiles):
        self.mapping = isinstance(files, dict)
        if isinstance(files, dict):
            _check_mapping(files)
            self.files = {str(n): (list(v) if v is not None else None) for n, v in files.items()}
        else:
            self.files = {DEFAULT_SET: list(files) if files else None}
        self.names = list(self.files)
        # The primary set is the split ``validation`` (as a single set is), the others ``validation_<name>``.
        self.splits = {n: "validation" if i == 0 else f"validation_{n}" for i, n in enumerate(self.names)}
        self.held_out_split = next((self.splits[n] for n, f in self.files.items() if f is None), None)

    def key(self, name: str) -> str:
        """The config key of a set's files, for error messages."""
        return f"data.validation_files.{name}" if self.mapping else "data.validation_files"

    def split_key(self, split: str) -> str:
        """The config key behind a split of the corpus (``train``, ``test`` or a validation set's)."""
        if split in ("train", "test"):
            return f"data.{split}_files"
        return self.key(next(n for n, s in self.splits.items() if s == split))


def check_forgetting_warning(value: float | None) -> None:
    """``data.forgetting_warning`` must be a positive fraction when set."""
    if value is not None and value <= 0:
        raise MLMAdaptError(f"data.forgetting_warning={value} must be > 0, e.g. 0.2 (+20% perplexity)")
