"""Streaming corpora (``data.streaming: true``): larger than memory or disk cache, never materialized.

The pipeline is ``datasets``' own lazy one: ``load_dataset(..., streaming=True)`` -> drop empty and
held-out lines -> a disjoint part per rank (whole files, fixed for the run, when there are at least as
many files as ranks; else every ``world_size``-th document) -> ``shuffle`` (the rank's file order + a
buffer, reseeded per pass with ``set_epoch``) -> segmentation/tokenization and packing as batched
``map``. Inside DataLoader workers ``datasets`` further splits a rank's files between the workers.

:class:`StreamingCorpus` holds the opened stream and hands out what the DataModule needs: the in-memory
held-out validation documents and each rank's block stream. Ranks never run out: :class:`StreamingBlocks`
restarts its shard (a new pass, new shuffle, new masks) when it ends, so every rank yields batches until
``trainer.max_steps`` and no rank waits at an epoch end for a rank that has more data. The price: a stream has
no epoch length, so ``trainer.max_steps`` is required.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

import datasets
import numpy as np
import torch
from datasets.distributed import split_dataset_by_node
from transformers import PreTrainedTokenizerBase

from mlm_adapt.data.preprocess import is_non_empty, to_blocks
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.corpus import BUILDERS, builder_options, file_error, text_only
from mlm_adapt.text.segmentation import WordSegmenter


def is_held_out(text: str, fraction: float, seed: int) -> bool:
    """Deterministic validation membership of a document from a hash of its text.

    Independent of order, sharding and world size, so every rank agrees without coordination.
    """
    digest = hashlib.blake2b(f"{seed}:{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < fraction


def _keep(batch: dict[str, list], fraction: float, seed: int, held_out: bool) -> list[bool]:
    return [
        non_empty and is_held_out(text, fraction, seed) == held_out
        for text, non_empty in zip(batch["text"], is_non_empty(batch), strict=True)
    ]


def load_stream(files: list[str], key: str, text_column: str) -> datasets.IterableDataset:
    """Opens local files (one format) as a streaming dataset with a ``text`` column; one shard per file."""
    builders = {BUILDERS[f[f.rfind(".") :].lower()] for f in files}
    if len(builders) != 1:
        raise MLMAdaptError(
            f"{key}: data.streaming needs files of one format, got {', '.join(sorted(builders))}"
        )
    try:
        builder = builders.pop()
        stream = datasets.load_dataset(
            builder, data_files=files, split="train", streaming=True, **builder_options(builder)
        )
    except Exception as exc:
        raise MLMAdaptError(f"{key}: could not stream {', '.join(files)}: {exc}") from exc
    return text_only(stream, text_column)


def read_files_safely(stream: Iterable[Any], files: list[str], key: str) -> Iterator[Any]:
    """Iterates ``stream``; a read error of one of ``files`` becomes one line naming the file and line.

    A stream decodes and parses lazily, so bad bytes surface only here (in a DataLoader worker, possibly
    hours into a run); ``datasets`` names neither the file nor the line, so the files are scanned for them.
    """
    try:
        yield from stream
    except Exception as exc:
        error = file_error(files, key) if files else None
        if error is None:
            raise
        raise error from exc


def split_text(
    stream: datasets.IterableDataset, fraction: float, seed: int, held_out: bool
) -> datasets.IterableDataset:
    """The documents of ``stream`` that are (``held_out=True``) or are not held out for validation."""
    return stream.filter(
        _keep, batched=True, fn_kwargs={"fraction": fraction, "seed": seed, "held_out": held_out}
    )


def content_id(input_ids: Any) -> int:
    """A 63-bit example id from a block's tokens: the masking key when there is no dataset index."""
    data = np.asarray(input_ids, dtype=np.int32).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def shard_for_rank(
    stream: datasets.IterableDataset, rank: int, world_size: int, seed: int, shuffle_buffer_size: int
) -> datasets.IterableDataset:
    """This rank's disjoint part of the stream, shuffled (its file order and a buffer of documents).

    With at least as many files (shards) as ranks, a rank owns a fixed set of files for the whole run
    (``shard``), so ranks that drift apart in passes (uneven files) still never read the same file; the
    per-pass shuffle permutes only the rank's own files. With fewer files than ranks, every rank reads the
    stream and keeps every ``world_size``-th document (``split_dataset_by_node``).
    """
    if world_size > 1:
        if stream.num_shards >= world_size:
            stream = stream.shard(num_shards=world_size, index=rank)
        else:
            stream = split_dataset_by_node(stream, rank=rank, world_size=world_size)
    return stream.shuffle(seed=seed, buffer_size=shuffle_buffer_size) if shuffle_buffer_size > 1 else stream


class StreamingBlocks(torch.utils.data.IterableDataset):
    """Endless passes over a rank's block stream, each item keyed for the masking collator.

    Items carry ``example_id`` (a hash of the block's tokens) and ``epoch`` (the pass number), so masks are
    new every pass and identical after a resume. ``state_dict``/``load_state_dict`` (used by
    ``StatefulDataLoader``, hence by Lightning checkpoints) save the pass and the position inside it;
    ``datasets`` refills shuffle buffers on resume, so with a buffer the resumed order is close, not exact.

    Args:
        blocks: The rank's stream of ``input_ids``/``word_ids`` blocks.
        files: The local files streamed, to name the file and line of a read error.
    """

    def __init__(self, blocks: datasets.IterableDataset, files: list[str] | None = None):
        self.blocks = blocks
        self.files = files or []
        self.epoch = 0
        self._resumed = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            self.blocks.set_epoch(self.epoch)
            yielded = False
            for row in read_files_safely(self.blocks, self.files, "data.train_files"):
                yielded = True
                yield {**row, "example_id": content_id(row["input_ids"]), "epoch": self.epoch}
            # An empty pass means an empty shard (e.g. a worker without files): end instead of spinning.
            # Not so for a resumed pass, which is empty when the checkpoint fell right at its end.
            if not yielded and not self._resumed:
                return
            self._resumed = False
            self.epoch += 1

    def state_dict(self) -> dict[str, Any]:
        """The pass number and the position of ``datasets`` inside it."""
        return {"epoch": self.epoch, "blocks": self.blocks.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues at the saved pass and position."""
        self.epoch = state["epoch"]
        self.blocks.load_state_dict(state["blocks"])
        self._resumed = True


def load_hub_stream(name: str, config: str | None, text_column: str) -> datasets.IterableDataset:
    """Opens the ``train`` split of a Hub dataset (or local dataset dir) as a ``text`` stream."""
    try:
        stream = datasets.load_dataset(name, config, split="train", streaming=True)
    except Exception as exc:
        raise MLMAdaptError(f"data.dataset_name: could not stream {name!r}: {exc}") from exc
    return text_only(stream, text_column)


class StreamingCorpus:
    """A training corpus read lazily; validation documents are held out of it by a hash of their text.

    Args:
        documents: The stream of documents (a ``text`` column).
        validation_split: Fraction of documents held out for validation (0: none, the validation data
            comes from elsewhere).
        seed: Seed of the held-out hash and of the shuffling.
        files: The local files of ``documents`` (none for a Hub dataset), to name one that fails to read.
    """

    def __init__(
        self,
        documents: datasets.IterableDataset,
        validation_split: float,
        seed: int,
        files: list[str] | None = None,
    ):
        self.documents = documents
        self.files = files or []
        self.validation_split = validation_split
        self.seed = seed

    def validation_documents(self, limit: int) -> datasets.Dataset:
        """The first ``limit`` held-out documents, in memory: every rank reads the same fixed set."""
        held_out = split_text(self.documents, self.validation_split, self.seed, held_out=True)
        rows = read_files_safely(held_out.take(limit), self.files, "data.train_files")
        texts = [row["text"] for row in rows]
        if not texts:
            raise MLMAdaptError(
                "data.validation_split: no held-out document in the stream; "
                "raise it or set data.validation_files"
            )
        return datasets.Dataset.from_dict({"text": texts})

    def training_documents(self) -> datasets.IterableDataset:
        """The documents that are not held out (all of them when ``validation_split`` is 0)."""
        return split_text(self.documents, self.validation_split, self.seed, held_out=False)

    def rank_blocks(
        self,
        rank: int,
        world_size: int,
        shuffle_buffer_size: int,
        tokenizer: PreTrainedTokenizerBase,
        segmenter: WordSegmenter,
        max_seq_length: int,
        packing: bool,
    ) -> StreamingBlocks:
        """This rank's endless, shuffled stream of blocks (documents of one ``map`` batch packed together)."""
        shard = shard_for_rank(self.training_documents(), rank, world_size, self.seed, shuffle_buffer_size)
        return StreamingBlocks(to_blocks(shard, tokenizer, segmenter, max_seq_length, packing), self.files)
