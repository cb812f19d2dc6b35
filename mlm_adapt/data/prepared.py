"""Prepare once, train anywhere: the corpus segmented, tokenized and packed into memory-mapped shards.

``python -m mlm_adapt prepare`` runs the DataModule's own pipeline (the same ``datasets`` maps as ``fit``,
so the blocks are identical) with its ``datasets`` cache inside a staging directory, then writes every
split as Arrow shards with narrow integer types (``uint16`` token ids when the vocabulary allows, ``int16``
word ids: block word ids are compact, below ``max_seq_length``) and a manifest. Only then is the staging
directory renamed to its final name, so an interrupted prepare never leaves a directory that loads as
complete, and the intermediate caches (about 8x the corpus) go with the staging directory's remains.

``fit``/``validate``/``preview`` with ``data.prepared_dir`` memory-map the shards (``Dataset.from_file``):
no rank segments or tokenizes anything and the raw corpus is not read.

Split across tasks (``prepare --shard i/N``, a Slurm array: ``scripts/slurm/prepare.sbatch``): every task
loads the documents as a one-process prepare does (same held-out split), keeps its contiguous
share of every split and writes it as ``DIR/part-0000i-of-0000N``, a complete prepared directory of its own
published by the same rename (its manifest is the completion marker: a rerun skips a finished part and
redoes an unfinished one). ``data.prepared_dir DIR`` then reads the N parts in order. The shares are cut at
multiples of :data:`~mlm_adapt.data.preprocess.BATCH` documents, where packing restarts anyway (as the
preprocessing workers' shares are), so the parts hold exactly the blocks, in the same order, of a one-task
prepare, whatever N and whatever ``data.preprocessing_num_workers``.
"""

from __future__ import annotations

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

from mlm_adapt.data.fingerprint import blocks_fingerprint
from mlm_adapt.data.prepared_manifest import (
    FORMAT_VERSION,
    MANIFEST,
    prepared_settings,
    read_manifest,
    setting_conflicts,
    test_files_record,
    write_manifest,
)
from mlm_adapt.data.preprocess import share
from mlm_adapt.data.progress import Progress
from mlm_adapt.errors import MLMAdaptError, exception_line
from mlm_adapt.guard.outputs import Output, write_directory

# Shard counts are divisors of 192 = 2^6 * 3: a full 192 shards split evenly over any world_size x
# num_workers product of 1, 2, 4, 8 GPUs per node times 1-8 nodes with 1, 2, 3, 4, 6 or 8 loader
# workers up to 192 readers (e.g. 8 GPUs x 4 workers = 32, 16 x 6 = 96, 64 x 3 = 192).
SHARD_BASE = 192
# Fewer, larger shards for small corpora: a shard holds at least this many blocks.
MIN_BLOCKS_PER_SHARD = 4096
WRITE_BATCH = 8192
_PART_NAME = re.compile(r"^part-(\d{5})-of-(\d{5})$")
_SHARD_NAME = re.compile(r"^[A-Za-z0-9_]+-\d{5}-of-\d{5}\.arrow$")


_UNKNOWN = object()


def _row_indices(dataset: datasets.Dataset) -> Any:
    """The rows of its backing table ``dataset`` maps to (``None``: all, in order), else ``_UNKNOWN``."""
    return getattr(dataset, "_indices", _UNKNOWN)


def arrow_sum(length_fn: Any, dataset: datasets.Dataset, column: str) -> int:
    """Sum of per-row lengths of a column (respects the dataset's index mapping: a split or a filter).

    One Arrow compute over the backing table, then a ``take`` of the mapped rows' lengths: 4 bytes per
    document, where iterating an index-mapped dataset gathers it row by row in Python (0.5 s per 150,000
    documents). ``datasets`` keeps the mapping in ``Dataset._indices`` (docs/architecture.md, upgrade
    risks); without it the rows are summed chunk by chunk as they are read.
    """
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


def shard_count(blocks: int) -> int:
    """The largest divisor of :data:`SHARD_BASE` that leaves :data:`MIN_BLOCKS_PER_SHARD` per shard."""
    divisors = [d for d in range(1, SHARD_BASE + 1) if SHARD_BASE % d == 0]
    fitting = [d for d in divisors if d * MIN_BLOCKS_PER_SHARD <= blocks]
    return max(fitting, default=1)


def block_features(vocab_size: int, max_seq_length: int) -> datasets.Features:
    """Narrowest types for blocks: ``uint16`` ids below 65,536 tokens, ``int16`` word ids."""
    ids = "uint16" if vocab_size <= 2**16 else "int32"
    words = "int16" if max_seq_length < 2**15 else "int32"
    return datasets.Features(
        {"input_ids": datasets.List(datasets.Value(ids)), "word_ids": datasets.List(datasets.Value(words))}
    )


def block_schema(vocab_size: int, max_seq_length: int) -> pa.Schema:
    """The Arrow schema of :func:`block_features`: what every shard holds."""
    return block_features(vocab_size, max_seq_length).arrow_schema


def schema_dtypes(schema: pa.Schema) -> dict[str, str]:
    """``{"input_ids": "uint16", "word_ids": "int16"}``: a block schema as the manifest records it."""
    return {field.name: str(field.type.value_type) for field in schema}


def _write_shard(blocks: datasets.Dataset, path: Path, schema: pa.Schema) -> int:
    """Writes ``blocks`` as one Arrow stream file (what ``Dataset.from_file`` maps); returns its bytes.

    Not fsynced here: ``write_directory`` flushes every file of the staging directory before publishing it.
    """
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for chunk in blocks.with_format("arrow").iter(batch_size=WRITE_BATCH):
            # A safe cast: an id that does not fit the narrow type raises instead of wrapping around.
            writer.write_table(chunk.select(schema.names).cast(schema))
    return path.stat().st_size


def _write_split(split: str, blocks: datasets.Dataset, staging: Path, schema: pa.Schema, progress: Progress):
    count = shard_count(len(blocks))
    shards = []
    for i in progress.bar(range(count), total=count, desc=f"Writing {split} shards", unit="shard"):
        name = f"{split}-{i:05d}-of-{count:05d}.arrow"
        part = blocks.shard(count, i, contiguous=True)
        written = _write_shard(part, staging / name, schema)
        shards.append({"file": name, "blocks": len(part), "bytes": written})
    return shards


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


def _check_parts_home(target: Path, count: int) -> None:
    """Refuses a directory of one whole prepare, or of parts of another task count, as a part's home."""
    if target.is_symlink():
        raise MLMAdaptError(f"data.prepared_dir: {target} is a symbolic link; give the real directory")
    if (target / "manifest.json").exists():
        raise MLMAdaptError(
            f"data.prepared_dir: {target} holds a complete one-process prepare; --shard writes parts into a "
            "new directory"
        )
    counts = {n for n, _ in _parts(target).values()}
    if counts - {count}:
        raise MLMAdaptError(
            f"data.prepared_dir: {target} holds parts of a {min(counts - {count})}-task prepare, not "
            f"{count}; use the same number of tasks or a new directory"
        )
    others = [
        c.name
        for c in (target.iterdir() if target.is_dir() else ())
        if not _PART_NAME.match(c.name) and not c.name.startswith(".")
    ]
    if others:
        raise MLMAdaptError(
            f"data.prepared_dir: {target} holds {others[0]!r}, which no prepare wrote; choose a new directory"
        )


def _check_target(target: Path) -> None:
    if target.is_symlink():
        raise MLMAdaptError(f"data.prepared_dir: {target} is a symbolic link; give the real directory")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise MLMAdaptError(
            f"data.prepared_dir: {target} already exists; prepare never overwrites, remove it or choose "
            "another directory"
        )


def prepare_corpus(
    datamodule: Any,
    directory: str | Path,
    progress: Progress,
    shard: tuple[int, int] | None = None,
    inputs: Mapping[str, Sequence[str]] | None = None,
) -> dict:
    """Writes every split of an ``MLMDataModule`` as shards and a manifest into ``directory``.

    Written as every output of the tool is (:func:`mlm_adapt.guard.outputs.write_directory`): under the
    target's lock, in a marked staging directory beside it that holds the ``datasets`` cache too, published
    by one rename once the manifest is on disk. What a killed prepare left is removed only when its marker
    proves it ours; a user's directory of a similar name is never touched.

    Args:
        datamodule: The ``MLMDataModule`` (its ``datasets`` cache goes into the staging directory).
        directory: The prepared directory to create (must not exist, or be empty).
        progress: Bars or phase lines.
        shard: ``(i, N)``: write only task i's share, as ``directory/part-i-of-N`` (see the module
            docstring); a finished part of the same settings is kept (``manifest["skipped"]``).
        inputs: The run's input files by config key: the directory must not be, hold or lie inside one.

    Returns:
        The manifest (of the part, with ``shard``).
    """
    hp = datamodule.hparams
    if hp.streaming:
        raise MLMAdaptError("data.streaming: prepare writes the whole corpus; set data.streaming=false")
    target = Path(directory).absolute()
    if shard is not None:
        _check_parts_home(target, shard[1])
        target = target / part_name(*shard)
        if (target / MANIFEST).is_file():
            return _finished_part(datamodule, target, progress)
    target.parent.mkdir(parents=True, exist_ok=True)
    _check_target(target)
    output = Output(target, key="data.prepared_dir", inputs=inputs or {})
    started = time.perf_counter()
    with write_directory(output, proof=MANIFEST) as staging:
        cache = staging / "cache"  # every intermediate file of ``datasets`` lands inside staging
        manifest = _build(datamodule, staging, cache, progress, shard)
        with progress.phase("removing intermediate caches"):
            shutil.rmtree(cache, ignore_errors=True)
        manifest["prepare_seconds"] = round(time.perf_counter() - started, 1)
        write_manifest(staging, manifest)
    return manifest


def _finished_part(datamodule: Any, part: Path, progress: Progress) -> dict:
    """A part an earlier run of this task published: kept when its settings are this run's."""
    settings = prepared_settings(datamodule.hparams, datamodule.tokenizer, datamodule.validation_sets.names)
    manifest = _checked_manifest(part, settings)
    progress.log(f"{part} is complete (an earlier run of this task); kept")
    return {**manifest, "skipped": True}


def _build(
    datamodule: Any, staging: Path, cache: Path, progress: Progress, shard: tuple[int, int] | None = None
) -> dict:
    hp = datamodule.hparams
    tokenizer = datamodule.tokenizer
    with progress.phase("loading documents"):
        raw = datamodule.documents(cache_dir=str(cache))
        if shard is not None:
            raw = datasets.DatasetDict({k: d.select(share(len(d), *shard)) for k, d in raw.items()})
    processes = hp.preprocessing_num_workers or 1
    # The shards' narrow types from the start: the map writes half the bytes and the shards need no cast.
    features = block_features(len(tokenizer), hp.max_seq_length)
    with progress.phase(f"segmenting, tokenizing and packing ({processes} process{'es' * (processes > 1)})"):
        blocks = datamodule.blocks(datasets.DatasetDict({k: d for k, d in raw.items() if len(d)}), features)
    # A task's share of a small split can be empty (datasets cannot map an empty dataset).
    empty = datasets.Dataset.from_dict({"input_ids": [], "word_ids": []}, features=features)
    blocks = datasets.DatasetDict({split: blocks.get(split, empty) for split in raw})
    schema = features.arrow_schema
    splits = {}
    for split, dataset in blocks.items():
        with progress.phase(f"writing {split} shards"):
            shards = _write_split(split, dataset, staging, schema, progress)
            splits[split] = {
                "shards": shards,
                "documents": len(raw[split]),
                "blocks": len(dataset),
                "tokens": arrow_sum(pc.list_value_length, dataset, "input_ids"),
                "characters": arrow_sum(pc.utf8_length, raw[split], "text"),
            }
    set_names = datamodule.validation_sets.names
    return {
        "format_version": FORMAT_VERSION,
        "settings": prepared_settings(hp, tokenizer, set_names),
        "validation_sets": dict(datamodule.validation_sets.splits),
        "dtypes": schema_dtypes(schema),
        "corpus_fingerprint": blocks_fingerprint(blocks["train"]),
        "test_files": test_files_record(hp.test_files),
        "preprocessing_num_workers": hp.preprocessing_num_workers,
        "splits": splits,
        **({"part": {"index": shard[0], "count": shard[1]}} if shard else {}),
    }


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


def _column_types(schema: pa.Schema) -> str:
    """``input_ids uint16, word_ids int16``: a block schema as a message shows it."""
    return ", ".join(f"{field.name} {getattr(field.type, 'value_type', field.type)}" for field in schema)


def _check_shard(
    path: Path, blocks: datasets.Dataset, shard: dict, schema: pa.Schema, vocab_size: int, max_seq_length: int
) -> int:
    """Checks one memory-mapped shard against what prepare writes for this tokenizer; returns its tokens.

    Its column types, block count, block lengths (equal for ids and word ids, at most the block length),
    token ids (below the tokenizer's vocabulary size) and word ids (``-1`` or below the block length): one
    vectorized pass over the mapped columns, no Python per block, so a tampered or foreign shard is refused
    before the first step instead of failing in the embedding or masking the wrong words.
    """
    problem, tokens = _shard_problem(blocks, shard, schema, vocab_size, max_seq_length)
    if problem:
        raise MLMAdaptError(
            f"data.prepared_dir: shard {path / shard['file']} {problem}; the directory was altered, copied "
            "in part or prepared for another model: copy it again whole or run prepare again"
        )
    return tokens


def _shard_problem(
    blocks: datasets.Dataset, shard: dict, schema: pa.Schema, vocab_size: int, max_seq_length: int
) -> tuple[str | None, int]:
    """What is wrong with a shard (``None``: nothing) and the tokens it holds."""
    types, wanted = _column_types(blocks.data.schema), _column_types(schema)
    if types != wanted:
        return f"holds {types} where this tokenizer's blocks are {wanted}", 0
    if len(blocks) != shard["blocks"]:
        return f"holds {len(blocks)} blocks, the manifest says {shard['blocks']}", 0
    if not len(blocks):
        return None, 0
    ids, words = blocks.data.column("input_ids"), blocks.data.column("word_ids")
    lengths = pc.list_value_length(ids)
    tokens = int(pc.sum(lengths).as_py() or 0)
    if not pc.all(pc.equal(lengths, pc.list_value_length(words))).as_py():
        return "has blocks whose word ids do not match their tokens one for one", tokens
    if (longest := pc.max(lengths).as_py()) > max_seq_length:
        return f"has a block of {longest} tokens, longer than max_seq_length {max_seq_length}", tokens
    id_range, word_range = pc.min_max(pc.list_flatten(ids)), pc.min_max(pc.list_flatten(words))
    if (id_range["max"].as_py() or 0) >= vocab_size:
        return f"holds token id {id_range['max']}, beyond the tokenizer's {vocab_size} tokens", tokens
    if (word_range["min"].as_py() or 0) < -1 or (word_range["max"].as_py() or 0) >= max_seq_length:
        return (
            f"holds word ids {word_range['min']}..{word_range['max']}, outside -1..{max_seq_length - 1}",
            tokens,
        )
    return None, tokens


def load_prepared(
    hparams: Any, tokenizer: PreTrainedTokenizerBase, set_names: list[str]
) -> tuple[datasets.DatasetDict, dict]:
    """Memory-maps ``hparams.prepared_dir``'s splits after checking its manifest against the run's settings.

    Args:
        hparams: The ``MLMDataModule``'s hyper-parameters.
        tokenizer: Its tokenizer.
        set_names: Its validation set names, the primary one first.

    Returns:
        The blocks by split (``train``, ``validation``, ``validation_<name>``, ``test``) and the manifest.
    """
    path = Path(hparams.prepared_dir)
    settings = prepared_settings(hparams, tokenizer, set_names)
    directories = _part_directories(path)
    loaded = [_load_one(directory, settings, len(tokenizer)) for directory in directories]
    _check_test_files(path, hparams.test_files, loaded[0][1])
    if len(loaded) == 1:
        return loaded[0]
    splits = {
        split: datasets.concatenate_datasets([blocks[split] for blocks, _ in loaded])
        for split in loaded[0][0]
    }
    manifest = {**loaded[0][1], "splits": {}}
    for split in splits:  # the counts of the whole corpus: sums over the parts
        entries = [m["splits"][split] for _, m in loaded]
        manifest["splits"][split] = {
            key: sum(e[key] for e in entries) for key in ("documents", "blocks", "tokens", "characters")
        }
        manifest["splits"][split]["shards"] = [s for e in entries for s in e["shards"]]
    return datasets.DatasetDict(splits), manifest


def _check_test_files(path: Path, test_files: list[str] | None, manifest: dict) -> None:
    """``data.test_files`` with a prepared directory: only the test files it was prepared with."""
    if not test_files:
        return
    prepared = manifest.get("test_files")
    if prepared != test_files_record(test_files):
        had = ", ".join(f["name"] for f in prepared) if prepared else "no test files"
        raise MLMAdaptError(
            f"data.test_files: {path} was prepared with {had}, not these; a prepared directory never reads "
            "raw files: prepare it again with these data.test_files, or drop data.prepared_dir"
        )


def _part_directories(path: Path) -> list[Path]:
    """``[path]`` for a one-process prepare; its N part directories in order for a ``--shard`` prepare."""
    if (path / "manifest.json").exists() or not path.is_dir():
        return [path]
    parts = _parts(path)
    if not parts:
        return [path]  # read_manifest names what is missing
    count = max(n for n, _ in parts.values())
    done = [i for i in range(count) if i in parts and (parts[i][1] / "manifest.json").is_file()]
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
    if manifest["dtypes"] != schema_dtypes(schema):
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


def prepared_stats(manifest: dict) -> dict[str, int]:
    """The DataModule's ``corpus_stats`` from a manifest's counts (no pass over the data)."""
    splits = manifest["splits"]
    stats = {
        "train_documents": splits["train"]["documents"],
        "validation_documents": splits["validation"]["documents"],
        "train_characters": splits["train"]["characters"],
        "train_examples": splits["train"]["blocks"],
        "validation_examples": splits["validation"]["blocks"],
    }
    for name, split in manifest.get("validation_sets", {}).items():
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
