"""Counts of a corpus by split, and a content fingerprint of its documents, without a Python pass over it.

The counts (documents, blocks, tokens, characters) are what ``fit`` logs as its ``mlm_adapt data:`` line
and a prepared directory's manifest records; the documents' fingerprint is what ``prepare --shard`` tasks
record to prove that their parts were cut from one corpus. Both are Arrow compute over the memory-mapped
columns (through a split's or filter's index mapping), never a copy of the text.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc

from mlm_adapt.errors import MLMAdaptError

# Documents a fingerprint reads besides the counts: evenly spaced, so an edit anywhere shifts most of them.
FINGERPRINT_SAMPLES = 64
_UNKNOWN = object()


def _row_indices(dataset: datasets.Dataset) -> Any:
    """The rows of its backing table ``dataset`` maps to (``None``: all, in order), else ``_UNKNOWN``."""
    return getattr(dataset, "_indices", _UNKNOWN)


def arrow_sum(length_fn: Any, dataset: datasets.Dataset, column: str) -> int:
    """Sum of per-row lengths of a column through the dataset's index mapping (a split or a filter): one
    Arrow compute over the backing table and a ``take``, where iterating the mapped rows gathers them in
    Python (0.5 s per 150,000 documents); without ``Dataset._indices`` (an upgrade risk), chunk by chunk."""
    indices = _row_indices(dataset)
    if indices is not _UNKNOWN and column in dataset.data.column_names:
        lengths = length_fn(dataset.data.column(column))
        if indices is not None:
            lengths = pc.take(lengths, indices.column(0))
        return int(pc.sum(lengths).as_py() or 0)
    total = 0
    # Through an index mapping a chunk is a copy: 10,000 documents of ~1 KB stay ~10 MB.
    for chunk in dataset.with_format("arrow").iter(batch_size=10_000):
        total += int(pc.sum(length_fn(chunk[column])).as_py() or 0)
    return total


def split_counts(raw: datasets.Dataset, blocks: datasets.Dataset) -> dict[str, int]:
    """A split's documents, blocks, tokens and characters (Arrow compute: no Python copy of the corpus)."""
    return {
        "documents": len(raw),
        "blocks": len(blocks),
        "tokens": arrow_sum(pc.list_value_length, blocks, "input_ids"),
        "characters": arrow_sum(pc.utf8_length, raw, "text"),
    }


def refuse_unmaskable(blocks: datasets.Dataset, tokenizer: Any, key: str, tokenizer_name: str) -> None:
    """Refuses, in one line naming ``key``, training blocks of which no token can be masked (no text token
    that is not a special token, as the collator masks: all ``[UNK]``, e.g. emoji or a script the vocabulary
    lacks), which would train on nothing with loss 0 and export the weights unchanged. Reads the blocks only
    until it finds a maskable token."""
    text_tokens = unknown = 0
    special = pa.array(tokenizer.all_special_ids, pa.int64())
    for chunk in blocks.with_format("arrow").iter(batch_size=10_000):
        ids = pc.cast(pc.list_flatten(chunk["input_ids"]), pa.int64())
        text = pc.greater_equal(pc.list_flatten(chunk["word_ids"]), 0)  # -1: the specials blocks add
        if pc.any(pc.and_(text, pc.invert(pc.is_in(ids, value_set=special)))).as_py():
            return
        text_tokens += int(pc.sum(pc.cast(text, pa.int64())).as_py() or 0)
        if tokenizer.unk_token_id is not None:
            unknown += int(pc.sum(pc.cast(pc.equal(ids, tokenizer.unk_token_id), pa.int64())).as_py() or 0)
    share = unknown / text_tokens if text_tokens else 0.0
    raise MLMAdaptError(
        f"{key}: no token of the training corpus can be masked: {share:.1%} of its tokens are "
        f"{tokenizer.unk_token} (the tokenizer of {tokenizer_name} does not cover the text); use a tokenizer "
        "that covers it, or add its characters as tokens (python -m mlm_adapt vocab --output_tokens FILE, "
        "then model.new_tokens_file FILE)"
    )


def corpus_stats(splits: dict[str, dict], validation_sets: dict[str, str]) -> dict[str, int]:
    """The DataModule's ``corpus_stats`` from the counts by split (a manifest's ``splits``)."""
    stats = {
        "train_documents": splits["train"]["documents"],
        "validation_documents": splits["validation"]["documents"],
        "train_characters": splits["train"]["characters"],
        "train_examples": splits["train"]["blocks"],
        "validation_examples": splits["validation"]["blocks"],
    }
    for name, split in validation_sets.items():
        if split != "validation":
            stats[f"validation_{name}_examples"] = splits[split]["blocks"]
    if "mix" in splits:
        stats["general_documents"] = splits["mix"]["documents"]
        stats["general_examples"] = splits["mix"]["blocks"]
    stats["train_tokens"] = splits["train"]["tokens"]
    return stats


def describe_stats(stats: dict[str, int]) -> str:
    """``train documents 1,234, ...``: the corpus statistics as one log line."""
    return ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in stats.items())


def documents_fingerprint(documents: datasets.DatasetDict) -> str:
    """A fingerprint of a corpus' documents by split (before any ``--shard`` share): each split's name,
    document and character counts and :data:`FINGERPRINT_SAMPLES` evenly spaced documents' text.

    Another corpus, another file list or a changed held-out split changes it; it reads the characters of
    every document (one Arrow pass) but the text of only the sampled ones.
    """
    payload = {}
    for name in sorted(documents):
        split = documents[name]
        n = len(split)
        rows = sorted({(i * n) // FINGERPRINT_SAMPLES for i in range(FINGERPRINT_SAMPLES)}) if n else []
        payload[name] = {
            "documents": n,
            "characters": arrow_sum(pc.utf8_length, split, "text"),
            "sample": list(split.select(rows)["text"]) if rows else [],
        }
    text = json.dumps(payload, ensure_ascii=False, sort_keys=True).encode()
    return hashlib.blake2b(text, digest_size=16).hexdigest()
