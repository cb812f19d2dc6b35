"""Prepare once, train anywhere: the corpus segmented, tokenized and packed into memory-mapped shards.

``python -m mlm_adapt prepare`` runs the DataModule's own pipeline (so the blocks are those of ``fit``) with
its ``datasets`` cache inside a staging directory, writes every split as Arrow shards of narrow integer
types and a manifest (:mod:`mlm_adapt.data.manifest`), and only then renames the staging directory: an
interrupted prepare never leaves a directory that loads as complete. ``data.prepared_dir`` memory-maps the
shards after checking the manifest and every shard; no raw file is read. ``prepare --shard i/N`` writes
task i's share of every split as ``DIR/part-0000i-of-0000N``, read back in order as the blocks of one
prepare once the parts prove they are the N shares of one corpus. See docs/prepare.md.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa

from mlm_adapt.data.corpus_statistics import documents_fingerprint, split_counts
from mlm_adapt.data.loader_state import blocks_fingerprint
from mlm_adapt.data.manifest import (
    FORMAT_VERSION,
    MANIFEST,
    check_part,
    check_parts,
    checked_manifest,
    part_record,
    prepared_settings,
    schema_dtypes,
    test_files_record,
    write_manifest,
)
from mlm_adapt.data.preprocess import block_features, share
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
    """The part directories in ``directory``: index -> (count, path); a name no prepare writes (index not
    below count, as ``part-00000-of-00000``) is not a part."""
    found = {}
    for child in directory.iterdir() if directory.is_dir() else ():
        match = _PART_NAME.match(child.name)
        index, count = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
        if index < count and child.is_dir() and not child.is_symlink():
            found[index] = (count, child)
    return found


def _check_target(target: Path, parts: int | None = None) -> None:
    """Refuses a non-empty directory as a prepare's target; as the home of the parts of a ``parts``-task
    prepare, one holding a whole prepare, parts of another count or anything else."""
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


class _Kept(Exception):
    """Leaves ``write_directory`` without publishing: the part on disk is this task's, of this corpus."""

    def __init__(self, manifest: dict) -> None:
        super().__init__("kept")
        self.manifest = manifest


def prepare_corpus(
    datamodule: Any,
    directory: str | Path,
    progress: Progress,
    shard: tuple[int, int] | None = None,
    inputs: Mapping[str, Sequence[str]] | None = None,
) -> dict:
    """Writes every split of an ``MLMDataModule`` as shards and a manifest into ``directory`` (new or
    empty), as every output is (:func:`mlm_adapt.guard.outputs.write_directory`), and returns the manifest.

    ``shard=(i, N)`` writes task i's share as ``directory/part-i-of-N``. A part an earlier run published is
    kept (``manifest["skipped"]``) when its settings, task and whole-corpus fingerprint are this run's,
    prepared again (replaced at the end) when only the corpus changed, and refused when its settings differ
    or it is another task's. The directory must not be, hold or lie inside ``inputs``.
    """
    if datamodule.streaming.enabled:
        raise MLMAdaptError(
            "data.streaming.enabled: prepare writes the whole corpus; set data.streaming.enabled=false"
        )
    settings = prepared_settings(datamodule)
    target, earlier = Path(directory).absolute(), None
    if shard is not None:
        _check_target(target, parts=shard[1])
        target = target / part_name(*shard)
        if (target / MANIFEST).is_file():  # a part an earlier run published
            earlier = checked_manifest(target, settings)
            check_part(target, earlier, *shard)
    if earlier is None:
        _check_target(target)
    # A stale part (its proof, the manifest, checked above) is replaced only once the new one is complete.
    output = Output(
        target, key="data.prepared_dir", inputs=inputs or {}, replaces=MANIFEST if earlier else None
    )
    started = time.perf_counter()
    try:
        with write_directory(output, proof=MANIFEST) as staging:
            manifest = _write_prepared(datamodule, settings, staging, progress, shard, earlier)
            manifest["prepare_seconds"] = round(time.perf_counter() - started, 1)
            write_manifest(staging, manifest)
    except _Kept as kept:
        progress.log(f"{target} is complete (an earlier run of this task, of the same corpus); kept")
        return {**kept.manifest, "skipped": True}
    return manifest


def _write_prepared(
    datamodule: Any,
    settings: dict,
    staging: Path,
    progress: Progress,
    shard: tuple[int, int] | None,
    earlier: dict | None,
) -> dict:
    """Writes the shards of every split into ``staging``; returns the manifest (raises :class:`_Kept` when
    ``earlier``, the part on disk, was cut from the same corpus)."""
    hp, tokenizer, sets = datamodule.hparams, datamodule.tokenizer, datamodule.validation_sets
    cache = staging / "cache"  # every intermediate file of ``datasets`` lands inside staging
    with progress.phase("loading documents"):
        raw = datamodule.documents(cache_dir=str(cache))
    part = None
    if shard is not None:
        # Every task loads the whole corpus: its fingerprint proves the parts are shares of one corpus.
        test_files = test_files_record(hp.test_files)
        part = part_record(*shard, documents_fingerprint(raw), settings, test_files)
        if earlier is not None:
            if earlier["part"]["corpus"] == part["corpus"]:
                raise _Kept(earlier)
            progress.log(f"the corpus changed since {part_name(*shard)} was prepared: preparing it again")
        raw = datasets.DatasetDict({k: d.select(share(len(d), *shard)) for k, d in raw.items()})
    workers = hp.preprocessing_num_workers or 1
    # The shards' narrow types from the start: the map writes half the bytes and the shards need no cast.
    features = block_features(len(tokenizer), hp.max_seq_length)
    with progress.phase(f"segmenting, tokenizing and packing ({workers} process{'es' * (workers > 1)})"):
        blocks = datamodule.make_blocks(
            datasets.DatasetDict({k: d for k, d in raw.items() if len(d)}), features
        )
    # A task's share of a small split can be empty (datasets cannot map an empty dataset).
    empty = datasets.Dataset.from_dict({"input_ids": [], "word_ids": []}, features=features)
    blocks = datasets.DatasetDict({split: blocks.get(split, empty) for split in raw})
    schema, splits = features.arrow_schema, {}
    for split, dataset in blocks.items():
        with progress.phase(f"writing {split} shards"):
            count, shards = shard_count(len(dataset)), []
            for i in progress.bar(range(count), total=count, desc=f"Writing {split} shards", unit="shard"):
                name = f"{split}-{i:05d}-of-{count:05d}.arrow"
                piece = dataset.shard(count, i, contiguous=True)
                written = _write_shard(piece, staging / name, schema)
                shards.append({"file": name, "blocks": len(piece), "bytes": written})
            splits[split] = {"shards": shards, **split_counts(raw[split], dataset)}
    manifest = {
        "format_version": FORMAT_VERSION,
        "settings": settings,
        "validation_sets": dict(sets.splits),
        "dtypes": schema_dtypes(schema),
        "corpus_fingerprint": blocks_fingerprint(blocks["train"]),
        "test_files": test_files_record(hp.test_files),
        "preprocessing_num_workers": hp.preprocessing_num_workers,
        "splits": splits,
        **({"part": part} if part else {}),
    }
    with progress.phase("removing intermediate caches"):
        shutil.rmtree(cache, ignore_errors=True)
    return manifest


def _open_shard(directory: Path, shard: dict) -> datasets.Dataset:
    path = directory / shard["file"]
    try:
        return datasets.Dataset.from_file(str(path))  # memory-mapped
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise MLMAdaptError(
            f"data.prepared_dir: shard {path} is missing or not an Arrow file ({exception_line(exc)}); copy "
            "the whole directory again or prepare it again"
        ) from None


def load_prepared(datamodule: Any) -> tuple[datasets.DatasetDict, dict]:
    """An ``MLMDataModule``'s ``prepared_dir`` (checked against its settings), memory-mapped: the blocks by
    split and the manifest (of a ``--shard`` prepare: the counts summed over its parts)."""
    hparams = datamodule.hparams
    path = Path(hparams.prepared_dir)
    settings = prepared_settings(datamodule)
    directories = _part_directories(path)
    manifests = [checked_manifest(directory, settings) for directory in directories]
    if directories != [path]:
        check_parts(directories, manifests)
    elif (part := manifests[0].get("part")) and part["count"] > 1:
        raise MLMAdaptError(
            f"data.prepared_dir: {path} is part {part['index']} of {part['count']} of a --shard prepare, a "
            "share of the corpus only; give the directory that holds all its parts"
        )
    loaded = [_load_one(d, m) for d, m in zip(directories, manifests, strict=True)]
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


def _load_one(path: Path, manifest: dict) -> tuple[datasets.DatasetDict, dict]:
    """One prepared directory (or part) of a ``manifest``: every shard, memory-mapped."""
    splits = {}
    for split, entry in manifest["splits"].items():
        parts = [_open_shard(path, shard) for shard in entry["shards"]]
        splits[split] = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    return datasets.DatasetDict(splits), manifest
