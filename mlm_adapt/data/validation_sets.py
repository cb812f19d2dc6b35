"""Named validation sets: ``data.validation_files`` as a list (one set) or a mapping ``{name: files}``.

The first set is the primary one (``val/*``: checkpoint monitors, the export's choice of checkpoint), the
others log ``val_<name>/*``; a ``null`` set is held out of the training documents. A set that overlaps the
training data (the same file, or identical documents in a sample) gets a warning (:func:`warn_overlap`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import datasets
from lightning.pytorch.utilities import rank_zero_warn

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.files import expand_files

ValidationFiles = list[str] | dict[str, list[str] | None] | None
# The name of the only set when ``data.validation_files`` is a list (or absent).
DEFAULT_SET = "validation"
_NAME = re.compile(r"^[A-Za-z0-9_]+$")


class ValidationSets:
    """``data.validation_files`` (files or globs of one set, or ``{name: files}``; ``None``: the held-out
    split), checked: each set's name, files, ``DatasetDict`` split and config key."""

    def __init__(self, files: ValidationFiles):
        self.mapping = isinstance(files, dict)
        if not self.mapping:
            files = {DEFAULT_SET: files or None}
        elif not files:
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
        self.files = {str(n): (list(v) if v is not None else None) for n, v in files.items()}
        self.names = list(self.files)
        # The primary set is the split ``validation`` (as a single set is), the others ``validation_<name>``.
        self.splits = {n: "validation" if i == 0 else f"validation_{n}" for i, n in enumerate(self.names)}
        self.held_out_split = next((self.splits[n] for n, f in self.files.items() if f is None), None)

    def key(self, name: str) -> str:
        """The config key of a set's files, for error messages."""
        return f"data.validation_files.{name}" if self.mapping else "data.validation_files"

    def split_key(self, split: str) -> str:
        """The config key behind a split of the corpus: ``train``, ``test``, ``mix`` or a validation set's."""
        if split in ("train", "test", "mix"):
            return f"data.{split}_files"
        return self.key(next(n for n, s in self.splits.items() if s == split))


def held_out_error(validation_split: float, documents: int) -> MLMAdaptError:
    """Why no validation set can be held out of ``documents`` training documents."""
    if validation_split <= 0:
        return MLMAdaptError(
            "data.validation_split: need validation data; set data.validation_files or a split in (0, 1)"
        )
    return MLMAdaptError(
        f"data.validation_files: the training corpus holds {documents} document, too few to hold out "
        f"data.validation_split={validation_split} of it; give data.validation_files (or more documents, "
        "e.g. one per line in a .txt file)"
    )


# Validation documents sampled (the first ones) and training documents searched for them.
VALIDATION_SAMPLE = 1000
TRAINING_SCAN = 200_000
# Sampled documents shorter than this are ignored: short lines ("好评", "谢谢") repeat in any corpus.
MIN_CHARS = 8


def _digests(texts: list[str]) -> set[bytes]:
    return {
        hashlib.blake2b(t.strip().encode(), digest_size=12).digest()
        for t in texts
        if len(t.strip()) >= MIN_CHARS
    }


def _resolved(files: Iterable[str]) -> set[Path]:
    return {Path(f).expanduser().resolve() for f in files}


def overlap_messages(
    train: datasets.Dataset,
    train_files: Iterable[str],
    validation: Mapping[str, tuple[list[str], datasets.Dataset]],
    train_key: str = "data.train_files",
) -> list[str]:
    """One line per validation set (``{config key: (expanded files, documents)}``) that overlaps the
    training documents or their expanded files (under ``train_key``: ``data.replay.files`` for replay)."""
    messages = []
    training_files = _resolved(train_files)
    seen: set[bytes] | None = None
    for key, (files, documents) in validation.items():
        shared = sorted(str(f) for f in _resolved(files) & training_files)
        if shared:
            messages.append(
                f"{key}: {', '.join(shared)} is also training data ({train_key}); its validation "
                "metrics measure memorization, not adaptation: give held-out text"
            )
            continue
        wanted = _digests(documents.select(range(min(len(documents), VALIDATION_SAMPLE)))["text"])
        if not wanted:
            continue
        if seen is None:
            seen = _digests(train.select(range(min(len(train), TRAINING_SCAN)))["text"])
        found = len(wanted & seen)
        if found:
            messages.append(
                f"{key}: {found} of {len(wanted)} sampled documents also occur in the training data "
                f"({train_key}); its validation metrics flatter the model: remove them from one side"
            )
    return messages


def warn_overlap(
    raw: datasets.DatasetDict,
    sets: ValidationSets,
    train_files: list[str] | None,
    replay_files: list[str] | None = None,
) -> None:
    """Warns (rank 0, one line each) about the validation sets of ``raw`` (the loaded documents by split)
    that overlap the training data (``None`` files: a Hub dataset), the replayed general text included (a
    general set that is also replayed cannot measure forgetting), and about replayed general text that is
    the training corpus (:func:`replay_overlap_messages`)."""
    given = {
        sets.key(name): (expand_files(files, sets.key(name)), raw[sets.splits[name]])
        for name, files in sets.files.items()
        if files
    }
    train = expand_files(train_files, "data.train_files") if train_files else []
    messages = overlap_messages(raw["train"], train, given)
    if replay_files and "mix" in raw:
        mix = expand_files(replay_files, "data.replay.files")
        messages += overlap_messages(raw["mix"], mix, given, "data.replay.files")
        messages += replay_overlap_messages(raw["train"], train, raw["mix"], mix)
    for message in messages:
        rank_zero_warn(f"mlm_adapt: {message}")


def replay_overlap_messages(
    train: datasets.Dataset, train_files: Iterable[str], mix: datasets.Dataset, replay_files: Iterable[str]
) -> list[str]:
    """One line when the replayed ``data.replay.files`` share a file, or sampled documents, with the training
    corpus: that replay trains on domain text as if it were general, and limits no forgetting."""
    shared = sorted(str(f) for f in _resolved(replay_files) & _resolved(train_files))
    if shared:
        return [
            f"data.replay.files: {', '.join(shared)} is also training data (data.train_files): replay would "
            "train on domain text as 'general' and limit no forgetting; give general-domain text"
        ]
    wanted = _digests(mix.select(range(min(len(mix), VALIDATION_SAMPLE)))["text"])
    if not wanted:
        return []
    found = len(wanted & _digests(train.select(range(min(len(train), TRAINING_SCAN)))["text"]))
    if not found:
        return []
    return [
        f"data.replay.files: {found} of {len(wanted)} sampled documents also occur in the training data "
        "(data.train_files): that part of replay is domain text, not general; remove them from one side"
    ]
