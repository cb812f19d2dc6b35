"""A cheap fingerprint of the training data, stored in checkpoints so a resume can tell the corpus changed.

A resumed run continues the data loader at a batch position; that position means something only for the
same training blocks in the same order. Hashing the whole corpus would cost seconds per gigabyte at every
start, so the fingerprint hashes the number of training blocks and :data:`SAMPLES` evenly spaced blocks
(their token ids): a different corpus, split, tokenizer or block length changes it, while moving or
touching the files (unlike ``datasets``' cache fingerprint, which hashes paths and modification times)
does not. Streaming corpora have no block table: their fingerprint hashes the file names and sizes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

from mlm_adapt.text.corpus import expand_files

SAMPLES = 64


def _digest(payload: Any) -> str:
    return hashlib.blake2b(json.dumps(payload, sort_keys=True).encode(), digest_size=16).hexdigest()


def blocks_fingerprint(dataset: Any, column: str = "input_ids", samples: int = SAMPLES) -> str:
    """Fingerprint of a block table (a ``datasets.Dataset``): its length and ``samples`` spaced rows."""
    n = len(dataset)
    indices = sorted({(i * n) // samples for i in range(samples)}) if n else []
    rows = dataset.select(indices)[column] if indices else []
    return _digest({"blocks": n, "sample": [list(map(int, row)) for row in rows]})


def files_fingerprint(files: Sequence[str]) -> str:
    """Fingerprint of streamed training files: their names and sizes, in order."""
    return _digest({"files": [(os.path.basename(f), os.path.getsize(f)) for f in files]})


def corpus_fingerprint(datamodule: Any) -> str | None:
    """The fingerprint of an ``MLMDataModule``'s training data after ``setup`` (``None``: not known)."""
    train = getattr(datamodule, "train_dataset", None)
    if train is not None:
        return blocks_fingerprint(train)
    files = getattr(datamodule, "hparams", {}).get("train_files")
    if getattr(datamodule, "train_stream", None) is not None and files:
        return files_fingerprint(expand_files(files, "data.train_files"))
    return None
