"""From documents to blocks, shared by in-memory and streaming corpora, ``fit`` and ``prepare``.

Per batch of documents, on flat arrays (no Python list per token, document or block): segment, tokenize with
word ids (:func:`~mlm_adapt.text.alignment.tokenize_flat`), pack (:func:`~mlm_adapt.text.blocks.pack_blocks`).
Packing restarts at each batch of :data:`BATCH` documents, where the workers of :func:`map_blocks` and
``prepare --shard`` cut their shares, so neither changes a block. In-memory datasets go through
:func:`map_blocks` (forked workers, cached by fingerprint); streamed ones through ``IterableDataset.map``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import os
import signal
import tempfile
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, TypeVar

import datasets
import numpy as np
import pyarrow as pa
import torch
from datasets.fingerprint import Hasher
from datasets.utils import tqdm as hf_tqdm
from transformers import PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError, exception_line
from mlm_adapt.guard.outputs import Output, write_file, write_text
from mlm_adapt.text.alignment import TOKENIZATION_VERSION, tokenize_flat
from mlm_adapt.text.blocks import PackedBlocks, pack_blocks
from mlm_adapt.text.segmentation import WordSegmenter
from mlm_adapt.text.tokenizer import block_special_ids


def _block_columns(ids: str, words: str) -> datasets.Features:
    return datasets.Features(
        {"input_ids": datasets.List(datasets.Value(ids)), "word_ids": datasets.List(datasets.Value(words))}
    )


BLOCK_FEATURES = _block_columns("int32", "int32")

# Documents per batch of the map function: packing restarts at each batch. ``datasets``' default map batch
# size, which earlier releases packed by: prepared directories keep their blocks.
BATCH = 1000


def block_features(vocab_size: int, max_seq_length: int) -> datasets.Features:
    """Narrowest types for blocks (``prepare``'s): ``uint16`` ids below 65,536 tokens, ``int16`` word ids
    (block word ids are compact, below ``max_seq_length``)."""
    ids = "uint16" if vocab_size <= 2**16 else "int32"
    words = "int16" if max_seq_length < 2**15 else "int32"
    return _block_columns(ids, words)


AnyDataset = TypeVar("AnyDataset", datasets.Dataset, datasets.IterableDataset, datasets.DatasetDict)


def is_non_empty(batch: dict[str, list]) -> list[bool]:
    """``filter`` predicate: documents with some non-space text."""
    return [bool(text and text.strip()) for text in batch["text"]]


def drop_empty(dataset: datasets.Dataset, name: str) -> datasets.Dataset:
    """``dataset`` without documents that hold no text (``name`` labels the progress bar)."""
    return dataset.filter(is_non_empty, batched=True, desc=f"Dropping empty lines ({name})")


def blocks_table(packed: PackedBlocks, features: datasets.Features = BLOCK_FEATURES) -> pa.Table:
    """Blocks as an Arrow table of ``features``; the cast to narrower types is checked: an id that does
    not fit raises instead of wrapping around."""
    schema = features.arrow_schema
    offsets = pa.array(packed.offsets.astype(np.int32))
    columns = [
        pa.ListArray.from_arrays(offsets, pa.array(values).cast(schema.field(name).type.value_type))
        for name, values in (("input_ids", packed.ids), ("word_ids", packed.word_ids))
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def documents_to_blocks(
    texts: list[str],
    tokenizer: PreTrainedTokenizerBase,
    segmenter: WordSegmenter,
    max_seq_length: int,
    packing: bool,
    document_delimiters: bool = False,
) -> PackedBlocks:
    """Segments, tokenizes and packs one batch of documents (the whole ``map`` step, usable alone)."""
    start_id, end_id = block_special_ids(tokenizer)
    tokens = tokenize_flat(texts, tokenizer, segmenter)
    ids, units, counts = tokens.ids, tokens.units, tokens.counts
    return pack_blocks(ids, units, counts, max_seq_length, start_id, end_id, packing, document_delimiters)


def to_blocks(
    documents: AnyDataset,
    tokenizer: PreTrainedTokenizerBase,
    segmenter: WordSegmenter,
    max_seq_length: int,
    packing: bool,
    document_delimiters: bool = False,
    features: datasets.Features = BLOCK_FEATURES,
    num_proc: int | None = None,
) -> AnyDataset:
    """Segments, tokenizes and packs the ``text`` column of ``documents`` (in memory or streamed, or a
    ``DatasetDict`` of them) into ``input_ids``/``word_ids`` blocks of ``features``; ``document_delimiters``
    gives packed documents their own ``[CLS] ... [SEP]``; ``num_proc`` workers (:func:`map_blocks`)."""
    fn_kwargs = {
        "tokenizer": tokenizer,
        "segmenter": segmenter,
        "max_seq_length": max_seq_length,
        "packing": packing,
        "document_delimiters": document_delimiters and packing,
    }
    if isinstance(documents, datasets.IterableDataset):
        return documents.map(_blocks_lists, fn_kwargs=fn_kwargs, batched=True, remove_columns=["text"])
    desc = "Segmenting, tokenizing and packing" if packing else "Segmenting, tokenizing and splitting"
    splits = documents.values() if isinstance(documents, datasets.DatasetDict) else [documents]
    # Once, and only when a split can be cached: a large vocabulary's definition takes a moment to hash.
    settings = settings_fingerprint(fn_kwargs, features) if any(map(_cache_dir, splits)) else None
    if isinstance(documents, datasets.DatasetDict):
        return datasets.DatasetDict(
            {
                split: map_blocks(dataset, fn_kwargs, features, num_proc or 1, f"{desc} ({split})", settings)
                for split, dataset in documents.items()
            }
        )
    return map_blocks(documents, fn_kwargs, features, num_proc or 1, desc, settings)


def _blocks_lists(batch: dict[str, list], **kwargs: Any) -> dict[str, list[list[int]]]:
    return documents_to_blocks(batch["text"], **kwargs).to_lists()


def map_blocks(
    documents: datasets.Dataset,
    fn_kwargs: dict[str, Any],
    features: datasets.Features,
    processes: int,
    desc: str,
    settings: str | None,
) -> datasets.Dataset:
    """The blocks of an in-memory dataset (``fn_kwargs``: those of :func:`documents_to_blocks` but the
    texts), by ``processes`` forked workers, cached next to its files.

    Each worker takes a contiguous share cut at multiples of :data:`BATCH` (the same blocks for any number
    of workers); forked, it inherits the tokenizer and segmenter instead of unpickling them, and writes one
    Arrow stream file. A worker that dies (the OOM killer) fails the call in one line instead of a hang.

    The files are a cache like ``datasets``' own, beside the documents' files: named by ``datasets``'
    fingerprint of the documents and ``settings`` (:func:`settings_fingerprint`; ``None``: not cached) and
    listed last by an index file, so a later call (``setup`` after ``prepare_data``, another node on a
    shared cache) only maps them. Without files, or caching, they are made in a temporary directory.
    """
    if len(documents) == 0:
        return datasets.Dataset.from_dict({name: [] for name in features}, features=features)
    cache_dir = _cache_dir(documents)
    # ``datasets``' own fingerprint of the documents (files, split, filter), as its map would use.
    key = Hasher.hash([documents._fingerprint, settings]) if cache_dir and settings else None
    index = Path(cache_dir, f"blocks-{key}.json") if key else None
    if index is not None and index.is_file():
        cached = _load_index(index)
        if cached is not None:
            return cached
    workers = max(1, min(processes, -(-len(documents) // BATCH)))
    shares = [share(len(documents), i, workers) for i in range(workers)]
    names = [f"{index.stem if index else 'blocks'}-{i:05d}-of-{workers:05d}.arrow" for i in range(workers)]
    with contextlib.ExitStack() as stack:
        if index is None:  # nowhere to keep them: a scratch directory, read into memory before it goes
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix=".blocks-"))
            paths = [Path(scratch, name) for name in names]
        else:  # each part published as every output is, when all were written
            paths = [stack.enter_context(write_file(_cache_output(index.parent / n))) for n in names]
        job = functools.partial(_write_blocks, documents, fn_kwargs, features)
        with hf_tqdm(total=len(documents), desc=desc, unit=" examples") as bar:
            if workers == 1:
                job(shares[0], paths[0], bar.update)
            else:
                _run_forked(job, shares, paths, bar.update)
        if index is None:
            tables = [pa.ipc.open_stream(pa.memory_map(str(path))).read_all() for path in paths]
            return datasets.Dataset(pa.concat_tables(tables), info=datasets.DatasetInfo(features=features))
    # The index, written last, lists the parts: an index on disk means every part it names is complete.
    write_text(_cache_output(index), json.dumps({"parts": names}))
    return _load_index(index)


def _cache_output(path: Path) -> Output:
    return Output(path, key="data.cache_dir", directory=False)


def share(length: int, index: int, count: int) -> range:
    """Share ``index`` of ``count`` contiguous shares of ``length`` documents, cut at multiples of
    :data:`BATCH` (a worker's, or a ``prepare --shard`` task's)."""
    batches = -(-length // BATCH)
    start, end = batches * index // count, batches * (index + 1) // count
    return range(min(start * BATCH, length), min(end * BATCH, length))


def _write_blocks(
    documents: datasets.Dataset,
    fn_kwargs: dict[str, Any],
    features: datasets.Features,
    rows: range,
    path: Path,
    advance: Callable[[int], Any],
) -> None:
    """One share of the documents through the map function into an Arrow stream file."""
    documents = documents.select(rows).with_format("arrow")
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, features.arrow_schema) as out:
        for batch in documents.iter(batch_size=BATCH):
            texts = batch.column("text").to_pylist()
            out.write_table(blocks_table(documents_to_blocks(texts, **fn_kwargs), features))
            advance(len(texts))


def _worker(job: Callable[..., None], rows: range, path: Path, pipe: Connection) -> None:
    # Stops are the parent's: a Ctrl-C or scancel reaching the whole process group must end in the parent's
    # one line and status, not in a worker dying first and being reported as a failure. The parent kills
    # its workers on the way out; a worker whose parent was killed ends at its next report.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_IGN)
    # The parent's OpenMP threads do not survive the fork: torch run by a segmenter here would wait on them
    # forever. One thread, as in DataLoader workers.
    torch.set_num_threads(1)
    try:
        job(rows, path, pipe.send)
        pipe.send(None)
    except BrokenPipeError:  # the command is gone: nothing to report to
        pass
    except MLMAdaptError as exc:
        pipe.send(exc)
    except BaseException as exc:  # noqa: BLE001 - anything else is reported by the parent in one line
        pipe.send(MLMAdaptError(f"data.preprocessing_num_workers: a worker failed: {exception_line(exc)}"))
    finally:
        pipe.close()


def _run_forked(job: Callable[..., None], shares: list[range], paths: list[Path], advance: Any) -> None:
    """Runs ``job`` on each share in a forked process; the first failure stops them all and is raised."""
    context = multiprocessing.get_context("fork")
    running: dict[Any, tuple[Any, Connection]] = {}
    try:
        for rows, path in zip(shares, paths, strict=True):
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(target=_worker, args=(job, rows, path, writer), daemon=True)
            process.start()
            writer.close()
            running[reader] = (process, reader)
        while running:
            for reader in wait(list(running)):
                process, _ = running[reader]
                try:
                    message = reader.recv()
                except EOFError:  # gone without a word: killed
                    process.join()
                    code = process.exitcode
                    death = (
                        f"killed by {signal.Signals(-code).name}"
                        if code and code < 0
                        else f"exit status {code}"
                    )
                    raise MLMAdaptError(
                        f"data.preprocessing_num_workers: a preprocessing worker died ({death}); "
                        "if memory ran out, lower data.preprocessing_num_workers"
                    ) from None
                if isinstance(message, int):
                    advance(message)
                    continue
                del running[reader]
                reader.close()
                process.join()
                if message is not None:
                    raise message
    finally:
        for process, reader in running.values():
            process.kill()
            process.join()
            reader.close()


def _cache_dir(documents: datasets.Dataset) -> str | None:
    """Where ``datasets`` keeps ``documents``' files (``None``: built in memory, or caching is off)."""
    if not documents.cache_files or not datasets.is_caching_enabled():
        return None
    return os.path.dirname(documents.cache_files[0]["filename"])


def settings_fingerprint(fn_kwargs: dict[str, Any], features: datasets.Features) -> str | None:
    """A hash of everything that shapes the blocks of a document (``None``: a setting cannot be hashed).

    The tokenizer enters by its class, its backend's definition (not the truncation or padding a call left
    behind) and the ids that open and close a block; not by its pickle, which holds the directory it was
    loaded from and whether the Hub was offline, so a moved model or another shell would miss the cache.
    """
    hasher = Hasher()
    try:
        hasher.update([TOKENIZATION_VERSION, BATCH, features])
        for name in sorted(fn_kwargs):
            hasher.update(name)
            value = fn_kwargs[name]
            hasher.update(_tokenizer_state(value) if name == "tokenizer" else value)
    except Exception:  # noqa: BLE001 - an unpicklable user segmenter: computed, not cached, as datasets does
        return None
    return hasher.hexdigest()


def _tokenizer_state(tokenizer: PreTrainedTokenizerBase) -> Any:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return tokenizer
    definition = json.loads(backend.to_str())
    definition.pop("truncation", None)
    definition.pop("padding", None)
    return [type(tokenizer).__name__, definition, block_special_ids(tokenizer)]


def _load_index(index: Path) -> datasets.Dataset | None:
    """The cached blocks an index lists, memory-mapped (``None``: a part is missing; they are made again)."""
    try:
        names = json.loads(index.read_text())["parts"]
        parts = [datasets.Dataset.from_file(str(index.parent / Path(name).name)) for name in names]
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
