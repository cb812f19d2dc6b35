"""Prepare once, train anywhere: the corpus segmented, tokenized and packed into memory-mapped shards.

``python -m mlm_adapt prepare`` runs the DataModule's own pipeline (so the blocks are those of ``fit``) with
its ``datasets`` cache inside a staging directory, writes every split as Arrow shards of narrow integer
types and a manifest, and only then renames the staging directory: an interrupted prepare never leaves a
directory that loads as complete. ``data.prepared_dir`` memory-maps the shards; no raw file is read.

The manifest records each setting the blocks depend on as the *content* it depends on (a hash of the
tokenizer's files, not its path): the directory may move, a change that would alter the blocks is refused
as ``old → new``. A directory may have been copied, edited or half-synced: its manifest's whole shape and
every shard are checked before the first step. ``prepare --shard i/N`` writes task i's share of every split
as ``DIR/part-0000i-of-0000N``, read back in order as the blocks of one prepare. See docs/prepare.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc
from transformers import PreTrainedTokenizerBase

from mlm_adapt.data.loader_state import blocks_fingerprint
from mlm_adapt.data.preprocess import block_features, block_schema, share
from mlm_adapt.data.progress import Progress
from mlm_adapt.data.validation_sets import ValidationSets
from mlm_adapt.errors import MLMAdaptError, exception_line
from mlm_adapt.guard.outputs import Output, write_directory
from mlm_adapt.text.tokenizer import read_new_tokens

# 2: document attention and the OpenCC conversion are settings, the test files are recorded.
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
# The tokenizer files that decide tokenization (model weights and configs do not).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)
# Shard counts are divisors of 192 = 2^6 * 3: a full 192 shards split evenly over any world_size x
# num_workers product of 1, 2, 4, 8 GPUs per node times 1-8 nodes with 1, 2, 3, 4, 6 or 8 loader
# workers up to 192 readers (e.g. 8 GPUs x 4 workers = 32, 16 x 6 = 96, 64 x 3 = 192).
SHARD_BASE = 192
# Fewer, larger shards for small corpora: a shard holds at least this many blocks.
MIN_BLOCKS_PER_SHARD = 4096
WRITE_BATCH = 8192
_PART_NAME = re.compile(r"^part-(\d{5})-of-(\d{5})$")
_SHARD_NAME = re.compile(r"^[A-Za-z0-9_]+-\d{5}-of-\d{5}\.arrow$")
_REWRITE = "the directory was altered or copied in part: copy it again whole or run prepare again"
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


def _dtypes(schema: pa.Schema) -> dict[str, str]:
    """A block schema's element type per column, as a manifest records it."""
    return {field.name: str(field.type.value_type) for field in schema}


def _column_types(schema: pa.Schema) -> str:
    """``input_ids uint16, word_ids int16``: a block schema as a message shows it."""
    return ", ".join(f"{field.name} {getattr(field.type, 'value_type', field.type)}" for field in schema)


def _digest(chunks: list[bytes]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for chunk in chunks:
        digest.update(len(chunk).to_bytes(8, "little") + chunk)
    return digest.hexdigest()


def tokenizer_hash(name_or_path: str, tokenizer: PreTrainedTokenizerBase, added: list[str]) -> str:
    """Hash of a tokenizer: its files when ``name_or_path`` is a directory, else its base vocabulary
    (``added``, the tokens of ``new_tokens_file``, left out: they are recorded on their own)."""
    directory = Path(name_or_path)
    if directory.is_dir():
        files = [directory / n for n in TOKENIZER_FILES if (directory / n).is_file()]
        return _digest([p.name.encode() + b"\0" + p.read_bytes() for p in files])
    extra = set(added)
    vocab = sorted((t, i) for t, i in tokenizer.get_vocab().items() if t not in extra)
    return _digest([json.dumps(vocab, ensure_ascii=False).encode()])


def file_hash(path: str | None) -> str | None:
    """Hash of a file's bytes (``None`` for no file)."""
    return _digest([Path(path).read_bytes()]) if path else None


def prepared_settings(hp: Any, tokenizer: PreTrainedTokenizerBase, sets: ValidationSets) -> dict:
    """The settings a prepared directory's blocks depend on, from an ``MLMDataModule``'s hyper-parameters,
    tokenizer and validation sets."""
    added = read_new_tokens(hp.new_tokens_file) if hp.new_tokens_file else []
    added_tokens = {"count": len(added), "hash": _digest([t.encode() for t in added])}
    name = hp.tokenizer_name_or_path
    return {
        "tokenizer": {"name": name, "hash": tokenizer_hash(name, tokenizer, added)},
        "max_seq_length": hp.max_seq_length,
        "packing": hp.packing,
        "document_attention": bool(hp.document_attention) and hp.packing,
        "segmenter": {"backend": hp.segmenter, "hmm": hp.hmm},
        "opencc": hp.opencc,
        "user_dict": file_hash(hp.user_dict),
        "added_tokens": added_tokens if added else None,
        "validation_sets": list(sets.names),
        # The held-out split is drawn with the seed: another seed means other blocks.
        "held_out_split": {"fraction": hp.validation_split, "seed": hp.seed} if sets.held_out_split else None,
        # General text for replay is its own split (``mix``); the rate is drawn at sampling time.
        "mix": {"files": [Path(f).name for f in hp.mix_files]} if hp.mix_files else None,
    }


def test_files_record(files: list[str] | None) -> list[dict] | None:
    """What the test split was built from: each file's name and content hash (``None``: no test split)."""
    return [{"name": Path(f).name, "hash": file_hash(f)} for f in files] if files else None


def _shown(key: str, value: Any) -> str:
    if key == "tokenizer" and isinstance(value, dict):
        return f"{value['name']} (files {value['hash'][:12]})"
    if key == "added_tokens" and isinstance(value, dict):
        return f"{value.get('count')} tokens ({str(value.get('hash'))[:12]})"
    if key == "user_dict" and isinstance(value, str):
        return f"file {value[:12]}"
    if value is None:
        return "none"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return json.dumps(value, ensure_ascii=False)


def setting_conflicts(saved: dict, current: dict) -> list[str]:
    """``key: old → new`` for every setting that differs (a moved tokenizer with equal files does not)."""
    conflicts = []
    for key, value in current.items():
        old = saved.get(key)
        tokenizers = key == "tokenizer" and isinstance(old, dict) and isinstance(value, dict)
        if (old.get("hash") != value.get("hash")) if tokenizers else old != value:
            conflicts.append(f"{key} {_shown(key, old)} → {_shown(key, value)}")
    return conflicts


class _Count:
    """Schema marker: a non-negative integer."""


# The shape of a manifest: a dict maps keys to the shape of their values ("?" marks an optional key), a
# one-element list is a list of that shape, ``_Count`` a non-negative integer, a type that type.
_SHARD = {"file": str, "blocks": _Count, "bytes": _Count}
_SPLIT = {"shards": [_SHARD], "documents": _Count, "blocks": _Count, "tokens": _Count, "characters": _Count}
_MANIFEST = {
    "format_version": int,
    "settings": dict,
    "validation_sets": dict,
    "dtypes": {"input_ids": str, "word_ids": str},
    "corpus_fingerprint": str,
    "splits": dict,
    "test_files?": (list, type(None)),
    "part?": {"index": _Count, "count": _Count},
}


def _shape_error(value: Any, shape: Any, key: str) -> str | None:
    """Where ``value`` departs from ``shape`` (``key`` is its dotted path), or ``None``."""
    if shape is _Count:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else f"{key} is {json.dumps(value)[:40]} where a count (integer >= 0) belongs"
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{key} is a {type(value).__name__} where a mapping belongs"
        for name, inner in shape.items():
            optional, name = name.endswith("?"), name.rstrip("?")
            if name not in value and not optional:
                return f"{key}.{name} is missing"
            if name in value and (error := _shape_error(value[name], inner, f"{key}.{name}")):
                return error
        return None
    if isinstance(shape, list):
        if not isinstance(value, list) or not value:
            return f"{key} is {json.dumps(value)[:40]} where a non-empty list belongs"
        return next((e for i, v in enumerate(value) if (e := _shape_error(v, shape[0], f"{key}[{i}]"))), None)
    if isinstance(value, shape) and not (isinstance(value, bool) and shape is int):
        return None
    return f"{key} is a {type(value).__name__}, not the {getattr(shape, '__name__', 'value')} it should be"


def check_manifest(manifest: Any, path: Path) -> dict:
    """``manifest`` if it has the whole shape :func:`write_manifest` gives it, else one line naming the key:
    every key and type, every split and shard entry, the shards' block counts adding up to their split's,
    and the train split, the validation split and every split ``validation_sets`` names present."""
    splits = manifest.get("splits") if isinstance(manifest, dict) else None
    error = _shape_error(manifest, _MANIFEST, "manifest")
    if error is None:
        error = next((e for n, v in splits.items() if (e := _shape_error(v, _SPLIT, f"splits.{n}"))), None)
    if error is None:
        named = manifest["validation_sets"]
        wanted = ["train", "validation", *(v for v in named.values() if isinstance(v, str))]
        missing = [split for split in wanted if split not in splits]
        if missing or not all(isinstance(v, str) for v in named.values()):
            error = f"splits has no {missing[0]!r} split" if missing else "validation_sets holds a non-name"
    if error is None:
        for name, split in splits.items():
            listed = sum(shard["blocks"] for shard in split["shards"])
            if listed != split["blocks"]:
                error = f"splits.{name} counts {split['blocks']} blocks but its shards list {listed}"
                break
    if error:
        raise MLMAdaptError(f"data.prepared_dir: {path}: {error.removeprefix('manifest.')}; {_REWRITE}")
    return manifest


def read_manifest(directory: Path) -> dict:
    """The manifest of a complete prepared directory; a missing or foreign one is refused in one line."""
    path = directory / MANIFEST
    hint = f"run `python -m mlm_adapt prepare --config CONFIG --data.prepared_dir {directory}` first"
    if not directory.is_dir():
        raise MLMAdaptError(f"data.prepared_dir: {directory} does not exist; {hint}")
    if not path.is_file():
        raise MLMAdaptError(
            f"data.prepared_dir: {directory} has no {MANIFEST} (not a prepared directory, or an interrupted "
            f"prepare); {hint}"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MLMAdaptError(f"data.prepared_dir: {path} is unreadable ({exc}); {hint}") from None
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if version != FORMAT_VERSION:
        raise MLMAdaptError(
            f"data.prepared_dir: {path} has format version {version}, this mlm_adapt reads {FORMAT_VERSION}; "
            f"{hint}"
        )
    return check_manifest(manifest, path)


def write_manifest(directory: Path, manifest: dict) -> None:
    """Writes ``manifest.json`` into a staging directory of ``write_directory`` (which fsyncs it)."""
    text = json.dumps(manifest, ensure_ascii=False, indent=2, sort_keys=True)
    (directory / MANIFEST).write_text(text, encoding="utf-8")


def _write_shard(blocks: datasets.Dataset, path: Path, schema: pa.Schema) -> int:
    """Writes ``blocks`` as one Arrow stream file (what ``Dataset.from_file`` maps); returns its bytes
    (``write_directory`` fsyncs every file of the staging directory before publishing it)."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for chunk in blocks.with_format("arrow").iter(batch_size=WRITE_BATCH):
            # A safe cast: an id that does not fit the narrow type raises instead of wrapping around.
            writer.write_table(chunk.select(schema.names).cast(schema))
    return path.stat().st_size


def shard_count(blocks: int) -> int:
    """The largest divisor of :data:`SHARD_BASE` that leaves :data:`MIN_BLOCKS_PER_SHARD` per shard."""
    divisors = (d for d in range(1, SHARD_BASE + 1) if SHARD_BASE % d == 0)
    return max((d for d in divisors if d * MIN_BLOCKS_PER_SHARD <= blocks), default=1)


def parse_shard(value: str) -> tuple[int, int]:
    """``"i/N"`` (0 <= i < N) as ``(i, N)``; anything else is refused in one line naming ``--shard``."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", value or "")
    index, count = (int(match.group(1)), int(match.group(2))) if match else (-1, 0)
    if not match or not 0 <= index < count or count > 99999:
        raise MLMAdaptError(
            f"--shard {value!r}: give TASK/TASKS with 0 <= TASK < TASKS, e.g. --shard 0/4 "
            "(a Slurm array task: $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)"
        )
    return index, count


def part_name(index: int, count: int) -> str:
    """The directory of task ``index`` of ``count`` inside a prepared directory."""
    return f"part-{index:05d}-of-{count:05d}"


def _parts(directory: Path) -> dict[int, tuple[int, Path]]:
    """The part directories in ``directory``: index -> (count, path)."""
    found = {}
    for child in directory.iterdir() if directory.is_dir() else ():
        match = _PART_NAME.match(child.name)
        if match and child.is_dir() and not child.is_symlink():
            found[int(match.group(1))] = (int(match.group(2)), child)
    return found


def _check_target(target: Path, parts: int | None = None) -> None:
    """Refuses a link or a non-empty directory as a prepare's target; as the home of the parts of a
    ``parts``-task prepare, one holding a whole prepare, parts of another count or anything else."""
    if target.is_symlink():
        raise MLMAdaptError(f"data.prepared_dir: {target} is a symbolic link; give the real directory")
    children = list(target.iterdir()) if target.is_dir() else []
    if parts is None:
        if target.exists() and (not target.is_dir() or children):
            raise MLMAdaptError(
                f"data.prepared_dir: {target} already exists; prepare never overwrites, remove it or choose "
                "another directory"
            )
        return
    if (target / MANIFEST).exists():
        raise MLMAdaptError(
            f"data.prepared_dir: {target} holds a complete one-process prepare; --shard writes parts into a "
            "new directory"
        )
    counts = {n for n, _ in _parts(target).values()} - {parts}
    if counts:
        raise MLMAdaptError(
            f"data.prepared_dir: {target} holds parts of a {min(counts)}-task prepare, not {parts}; use the "
            "same number of tasks or a new directory"
        )
    others = [c.name for c in children if not _PART_NAME.match(c.name) and not c.name.startswith(".")]
    if others:
        raise MLMAdaptError(
            f"data.prepared_dir: {target} holds {others[0]!r}, which no prepare wrote; choose a new directory"
        )


def prepare_corpus(
    datamodule: Any,
    directory: str | Path,
    progress: Progress,
    shard: tuple[int, int] | None = None,
    inputs: Mapping[str, Sequence[str]] | None = None,
) -> dict:
    """Writes every split of an ``MLMDataModule`` as shards and a manifest into ``directory`` (new or
    empty), as every output is (:func:`mlm_adapt.guard.outputs.write_directory`), and returns the manifest.

    ``shard=(i, N)`` writes task i's share as ``directory/part-i-of-N`` (a finished part of the same
    settings is kept: ``manifest["skipped"]``); the directory must not be, hold or lie inside ``inputs``.
    """
    hp, tokenizer, sets = datamodule.hparams, datamodule.tokenizer, datamodule.validation_sets
    if hp.streaming:
        raise MLMAdaptError("data.streaming: prepare writes the whole corpus; set data.streaming=false")
    target = Path(directory).absolute()
    if shard is not None:
        _check_target(target, parts=shard[1])
        target = target / part_name(*shard)
        # A part an earlier run of this task published: kept when its settings are this run's.
        if (target / MANIFEST).is_file():
            manifest = _checked_manifest(target, prepared_settings(hp, tokenizer, sets))
            progress.log(f"{target} is complete (an earlier run of this task); kept")
            return {**manifest, "skipped": True}
    target.parent.mkdir(parents=True, exist_ok=True)
    _check_target(target)
    output = Output(target, key="data.prepared_dir", inputs=inputs or {})
    started = time.perf_counter()
    with write_directory(output, proof=MANIFEST) as staging:
        cache = staging / "cache"  # every intermediate file of ``datasets`` lands inside staging
        with progress.phase("loading documents"):
            raw = datamodule.documents(cache_dir=str(cache))
            if shard is not None:
                raw = datasets.DatasetDict({k: d.select(share(len(d), *shard)) for k, d in raw.items()})
        workers = hp.preprocessing_num_workers or 1
        # The shards' narrow types from the start: the map writes half the bytes and the shards need no cast.
        features = block_features(len(tokenizer), hp.max_seq_length)
        with progress.phase(f"segmenting, tokenizing and packing ({workers} process{'es' * (workers > 1)})"):
            blocks = datamodule.blocks(
                datasets.DatasetDict({k: d for k, d in raw.items() if len(d)}), features
            )
        # A task's share of a small split can be empty (datasets cannot map an empty dataset).
        empty = datasets.Dataset.from_dict({"input_ids": [], "word_ids": []}, features=features)
        blocks = datasets.DatasetDict({split: blocks.get(split, empty) for split in raw})
        schema, splits = features.arrow_schema, {}
        for split, dataset in blocks.items():
            with progress.phase(f"writing {split} shards"):
                count, shards = shard_count(len(dataset)), []
                for i in progress.bar(
                    range(count), total=count, desc=f"Writing {split} shards", unit="shard"
                ):
                    name = f"{split}-{i:05d}-of-{count:05d}.arrow"
                    part = dataset.shard(count, i, contiguous=True)
                    written = _write_shard(part, staging / name, schema)
                    shards.append({"file": name, "blocks": len(part), "bytes": written})
                splits[split] = {"shards": shards, **split_counts(raw[split], dataset)}
        manifest = {
            "format_version": FORMAT_VERSION,
            "settings": prepared_settings(hp, tokenizer, sets),
            "validation_sets": dict(sets.splits),
            "dtypes": _dtypes(schema),
            "corpus_fingerprint": blocks_fingerprint(blocks["train"]),
            "test_files": test_files_record(hp.test_files),
            "preprocessing_num_workers": hp.preprocessing_num_workers,
            "splits": splits,
            **({"part": {"index": shard[0], "count": shard[1]}} if shard else {}),
        }
        with progress.phase("removing intermediate caches"):
            shutil.rmtree(cache, ignore_errors=True)
        manifest["prepare_seconds"] = round(time.perf_counter() - started, 1)
        write_manifest(staging, manifest)
    return manifest


def _open_shard(directory: Path, shard: Any) -> datasets.Dataset:
    name = shard.get("file") if isinstance(shard, dict) else None
    if not isinstance(name, str) or not _SHARD_NAME.match(name):
        raise MLMAdaptError(f"data.prepared_dir: {directory} lists a shard {name!r} that is no shard name")
    path = directory / name
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise MLMAdaptError(
            f"data.prepared_dir: shard {path} is missing; copy the whole directory or prepare it again"
        ) from None
    if not stat.S_ISREG(info.st_mode) or info.st_size != shard.get("bytes"):
        raise MLMAdaptError(
            f"data.prepared_dir: shard {path} is not the file prepare wrote (a link, or {info.st_size} bytes "
            f"instead of {shard.get('bytes')}); copy the whole directory or prepare it again"
        )
    try:
        return datasets.Dataset.from_file(str(path))  # memory-mapped
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise MLMAdaptError(
            f"data.prepared_dir: shard {path} is not a readable Arrow file ({exception_line(exc)}); copy the "
            "whole directory again or prepare it again"
        ) from None


def _check_shard(
    path: Path, blocks: datasets.Dataset, shard: dict, schema: pa.Schema, vocab_size: int, max_seq_length: int
) -> int:
    """Checks a memory-mapped shard against what prepare writes for this tokenizer (column types, block
    count and lengths, token and word id ranges) in one vectorized pass; returns its tokens. A tampered or
    foreign shard is refused before the first step instead of failing in the embedding or masking."""
    problem, tokens = None, 0
    types, wanted = _column_types(blocks.data.schema), _column_types(schema)
    if types != wanted:
        problem = f"holds {types} where this tokenizer's blocks are {wanted}"
    elif len(blocks) != shard["blocks"]:
        problem = f"holds {len(blocks)} blocks, the manifest says {shard['blocks']}"
    elif len(blocks):
        ids, words = blocks.data.column("input_ids"), blocks.data.column("word_ids")
        lengths = pc.list_value_length(ids)
        tokens = int(pc.sum(lengths).as_py() or 0)
        id_range, word_range = pc.min_max(pc.list_flatten(ids)), pc.min_max(pc.list_flatten(words))
        if not pc.all(pc.equal(lengths, pc.list_value_length(words))).as_py():
            problem = "has blocks whose word ids do not match their tokens one for one"
        elif (longest := pc.max(lengths).as_py()) > max_seq_length:
            problem = f"has a block of {longest} tokens, longer than max_seq_length {max_seq_length}"
        elif (id_range["max"].as_py() or 0) >= vocab_size:
            problem = f"holds token id {id_range['max']}, beyond the tokenizer's {vocab_size} tokens"
        elif (word_range["min"].as_py() or 0) < -1 or (word_range["max"].as_py() or 0) >= max_seq_length:
            problem = (
                f"holds word ids {word_range['min']}..{word_range['max']}, outside -1..{max_seq_length - 1}"
            )
    if problem:
        raise MLMAdaptError(
            f"data.prepared_dir: shard {path / shard['file']} {problem}; the directory was altered, copied "
            "in part or prepared for another model: copy it again whole or run prepare again"
        )
    return tokens


def load_prepared(
    hparams: Any, tokenizer: PreTrainedTokenizerBase, sets: ValidationSets
) -> tuple[datasets.DatasetDict, dict]:
    """An ``MLMDataModule``'s ``prepared_dir`` (checked against its settings), memory-mapped: the blocks by
    split and the manifest (of a ``--shard`` prepare: the counts summed over its parts)."""
    path = Path(hparams.prepared_dir)
    settings = prepared_settings(hparams, tokenizer, sets)
    loaded = [_load_one(directory, settings, len(tokenizer)) for directory in _part_directories(path)]
    manifest = loaded[0][1]
    if hparams.test_files and manifest.get("test_files") != test_files_record(hparams.test_files):
        # A prepared directory never reads raw files: only the test files it was prepared with.
        prepared = manifest.get("test_files")
        had = ", ".join(f["name"] for f in prepared) if prepared else "no test files"
        raise MLMAdaptError(
            f"data.test_files: {path} was prepared with {had}, not these; a prepared directory never reads "
            "raw files: prepare it again with these data.test_files, or drop data.prepared_dir"
        )
    if len(loaded) == 1:
        return loaded[0]
    splits = {split: datasets.concatenate_datasets([b[split] for b, _ in loaded]) for split in loaded[0][0]}
    keys = ("documents", "blocks", "tokens", "characters")
    counts = {split: {k: sum(m["splits"][split][k] for _, m in loaded) for k in keys} for split in splits}
    return datasets.DatasetDict(splits), {**manifest, "splits": counts}


def _part_directories(path: Path) -> list[Path]:
    """``[path]`` for a one-process prepare; its N part directories in order for a ``--shard`` prepare."""
    parts = _parts(path) if not (path / MANIFEST).exists() else {}
    if not parts:
        return [path]  # read_manifest names what is missing
    count = max(n for n, _ in parts.values())
    done = [i for i in range(count) if i in parts and (parts[i][1] / MANIFEST).is_file()]
    if len(done) < count or {n for n, _ in parts.values()} != {count}:
        missing = [i for i in range(count) if i not in done]
        shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
        raise MLMAdaptError(
            f"data.prepared_dir: {path} has {len(done)} of {count} parts complete (missing: task {shown}); "
            "run those tasks of the prepare array (a finished part is kept) and train when all are done"
        )
    return [parts[i][1] for i in range(count)]


def _checked_manifest(path: Path, settings: dict) -> dict:
    """The manifest of a prepared directory (or part) whose settings are ``settings``, else refused."""
    manifest = read_manifest(path)
    conflicts = setting_conflicts(manifest.get("settings") or {}, settings)
    if conflicts:
        raise MLMAdaptError(
            f"data.prepared_dir: {path} was prepared with other settings: {'; '.join(conflicts)}; set them "
            "back or run prepare again into a new directory"
        )
    return manifest


def _load_one(path: Path, settings: dict, vocab_size: int) -> tuple[datasets.DatasetDict, dict]:
    """One prepared directory (or part), checked whole: manifest, settings, then every shard."""
    manifest = _checked_manifest(path, settings)
    schema = block_schema(vocab_size, settings["max_seq_length"])
    if manifest["dtypes"] != _dtypes(schema):
        raise MLMAdaptError(
            f"data.prepared_dir: {path}: dtypes {manifest['dtypes']} where this tokenizer's blocks are "
            f"{_column_types(schema)}; the directory was altered or prepared for another model: prepare "
            "it again"
        )
    splits = {}
    for split, entry in manifest["splits"].items():
        parts, tokens = [], 0
        for shard in entry["shards"]:
            parts.append(_open_shard(path, shard))
            tokens += _check_shard(path, parts[-1], shard, schema, vocab_size, settings["max_seq_length"])
        if tokens != entry["tokens"]:
            raise MLMAdaptError(
                f"data.prepared_dir: {split} of {path} holds {tokens} tokens, its manifest says "
                f"{entry['tokens']}; copy the whole directory again or prepare it again"
            )
        splits[split] = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    return datasets.DatasetDict(splits), manifest
