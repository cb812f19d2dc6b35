"""Streaming corpora (``data.streaming.enabled: true``): larger than memory or disk cache, never materialized.

``datasets``' own lazy pipeline: ``load_dataset(..., streaming=True)`` -> drop empty and held-out lines -> a
disjoint part per rank -> ``shuffle`` (the rank's file order and a buffer, reseeded per pass) -> blocks by
a batched ``map``; inside DataLoader workers ``datasets`` splits a rank's files between the workers. Ranks
never run out: :class:`StreamingBlocks` restarts its shard (a new pass, new shuffle, new masks), so every
rank yields batches until ``trainer.max_steps`` (required: a stream has no epoch length) and none waits at
an epoch end for a rank with more data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import datasets
import numpy as np
import torch
from datasets.distributed import split_dataset_by_node

from mlm_adapt.data.preprocess import is_non_empty
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.corpus import builder_options, file_error, text_only
from mlm_adapt.text.files import BUILDERS, data_files, expand_files


@dataclass(kw_only=True, frozen=True)
class StreamingOptions:
    """Streaming the training corpus (``data.streaming.enabled``): for corpora larger than memory or the disk
    cache.

    Args:
        enabled: Stream the training corpus: nothing is cached, each rank reads a disjoint part, and
            ``trainer.max_steps`` sets the length.
        shuffle_buffer_size: Documents in the shuffle buffer (file order is shuffled too); 0 or 1: none.
        validation_documents: Without ``data.validation_files``: how many held-out documents (a
            ``data.validation_split`` fraction, chosen by a hash of the text) form the validation set.
    """

    enabled: bool = False
    shuffle_buffer_size: int = 10_000
    validation_documents: int = 2_000

    def check(self) -> StreamingOptions:
        """Refuses a negative buffer or no validation document in one line; returns the options."""
        if self.shuffle_buffer_size < 0:
            raise MLMAdaptError(
                f"data.streaming.shuffle_buffer_size={self.shuffle_buffer_size} must be at least 0"
            )
        if self.validation_documents < 1:
            raise MLMAdaptError(
                f"data.streaming.validation_documents={self.validation_documents} must be at least 1"
            )
        return self


def is_held_out(text: str, fraction: float, seed: int) -> bool:
    """Deterministic validation membership of a document from a hash of its text: independent of order,
    sharding and world size, so every rank agrees without coordination."""
    digest = hashlib.blake2b(f"{seed}:{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < fraction


def _keep(batch: dict[str, list], fraction: float, seed: int, held_out: bool) -> list[bool]:
    return [
        non_empty and is_held_out(text, fraction, seed) == held_out
        for text, non_empty in zip(batch["text"], is_non_empty(batch), strict=True)
    ]


def open_stream(hp: Any) -> tuple[datasets.IterableDataset, list[str]]:
    """The ``text`` stream of an ``MLMDataModule``'s training documents (``data.dataset_name``'s ``train``
    split, or ``data.train_files`` of one format: a shard per file) and its local files."""
    if hp.dataset_name:
        try:
            stream = datasets.load_dataset(hp.dataset_name, hp.dataset_config, split="train", streaming=True)
        except Exception as exc:
            raise MLMAdaptError(f"data.dataset_name: could not stream {hp.dataset_name!r}: {exc}") from exc
        return text_only(stream, hp.text_column), []
    files = expand_files(hp.train_files, "data.train_files")
    builders = {BUILDERS[f[f.rfind(".") :].lower()] for f in files}
    if len(builders) != 1:
        raise MLMAdaptError(
            "data.train_files: data.streaming.enabled needs files of one format, got "
            f"{', '.join(sorted(builders))}"
        )
    try:
        builder = builders.pop()
        stream = datasets.load_dataset(
            builder, data_files=data_files(files), split="train", streaming=True, **builder_options(builder)
        )
    except Exception as exc:
        raise MLMAdaptError(f"data.train_files: could not stream {', '.join(files)}: {exc}") from exc
    return text_only(stream, hp.text_column), files


def read_files_safely(stream: Iterable[Any], files: list[str]) -> Iterator[Any]:
    """Iterates ``stream``; a read error of one of ``files`` becomes one line naming the file and line.

    A stream decodes and parses lazily, so bad bytes surface only here (in a DataLoader worker, possibly
    hours into a run); ``datasets`` names neither the file nor the line, so the files are scanned for them.
    """
    try:
        yield from stream
    except Exception as exc:
        error = file_error(files, "data.train_files") if files else None
        if error is None:
            raise
        raise error from exc


def content_id(input_ids: Any) -> int:
    """A 63-bit example id from a block's tokens: the masking key when there is no dataset index."""
    data = np.asarray(input_ids, dtype=np.int32).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


class StreamingBlocks(torch.utils.data.IterableDataset):
    """Endless passes over a rank's stream of blocks (of the local ``files``, to name the file and line of a
    read error), each keyed by a hash of its tokens and the pass: new masks every pass, the same after a
    resume. ``state_dict`` (in checkpoints, through ``StatefulDataLoader``) holds the pass and the position
    in it; ``datasets`` refills shuffle buffers on resume, so with a buffer the resumed order is close."""

    def __init__(self, blocks: datasets.IterableDataset, files: list[str]):
        self.blocks = blocks
        self.files = files
        self.epoch = 0
        self._resumed = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            self.blocks.set_epoch(self.epoch)
            yielded = False
            for row in read_files_safely(self.blocks, self.files):
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


class StreamingCorpus:
    """A training corpus read lazily (``files``: its local files, to name one that fails to read); the
    validation documents, a ``validation_split`` fraction (0: none), are held out by a hash of their text."""

    def __init__(
        self, documents: datasets.IterableDataset, validation_split: float, seed: int, files: list[str]
    ):
        self.documents = documents
        self.files = files
        self.validation_split = validation_split
        self.seed = seed

    def _split(self, held_out: bool) -> datasets.IterableDataset:
        """The non-empty documents that are (or are not) held out."""
        kwargs = {"fraction": self.validation_split, "seed": self.seed, "held_out": held_out}
        return self.documents.filter(_keep, batched=True, fn_kwargs=kwargs)

    def validation_documents(self, limit: int) -> datasets.Dataset:
        """The first ``limit`` held-out documents, in memory: every rank reads the same fixed set."""
        texts = [row["text"] for row in read_files_safely(self._split(held_out=True).take(limit), self.files)]
        if not texts:
            raise MLMAdaptError(
                "data.validation_split: no held-out document in the stream; "
                "raise it or set data.validation_files"
            )
        return datasets.Dataset.from_dict({"text": texts})

    def rank_blocks(
        self,
        rank: int,
        world_size: int,
        shuffle_buffer_size: int,
        to_blocks: Callable[[datasets.IterableDataset], datasets.IterableDataset],
    ) -> StreamingBlocks:
        """This rank's endless stream of blocks of its disjoint part of the documents, shuffled: a fixed set
        of files for the whole run with at least as many files as ranks (ranks that drift apart in passes
        never read the same file), else every ``world_size``-th document."""
        stream = self._split(held_out=False)
        if world_size > 1 and stream.num_shards >= world_size:
            stream = stream.shard(num_shards=world_size, index=rank)
        elif world_size > 1:
            stream = split_dataset_by_node(stream, rank=rank, world_size=world_size)
        if shuffle_buffer_size > 1:
            stream = stream.shuffle(seed=self.seed, buffer_size=shuffle_buffer_size)
        return StreamingBlocks(to_blocks(stream), self.files)
