"""Streaming corpora (``data.streaming: true``): larger than memory or disk cache, never materialized.

The pipeline is ``datasets``' own lazy one: ``load_dataset(..., streaming=True)`` -> drop empty and
held-out lines -> a disjoint part per rank (whole files, fixed for the run, when there are at least as
many files as ranks; else every ``world_size``-th document) -> ``shuffle`` (the rank's file order + a
buffer, reseeded per pass with ``set_epoch``) -> segmentation/tokenization and packing as batched
``map``. Inside DataLoader workers ``datasets`` further splits a rank's files between the workers.

Ranks never run out: :class:`StreamingBlocks` restarts its shard (a new pass, new shuffle, new masks)
when it ends, so every rank yields batches until ``trainer.max_steps`` and no rank waits at an epoch end
for a rank that has more data. The price: a stream has no epoch length, so ``trainer.max_steps`` is required.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np
import torch
from datasets.distributed import split_dataset_by_node
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from mlm_adapt.corpus import BUILDERS, _text_only, expand_files
from mlm_adapt.errors import MLMAdaptError

if TYPE_CHECKING:
    from mlm_adapt.data import MLMDataModule


def is_held_out(text: str, fraction: float, seed: int) -> bool:
    """Deterministic validation membership of a document from a hash of its text.

    Independent of order, sharding and world size, so every rank agrees without coordination.
    """
    digest = hashlib.blake2b(f"{seed}:{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < fraction


def _keep(batch: dict[str, list], fraction: float, seed: int, held_out: bool) -> list[bool]:
    return [
        bool(text and text.strip()) and is_held_out(text, fraction, seed) == held_out
        for text in batch["text"]
    ]


def load_stream(files: list[str], key: str, text_column: str) -> datasets.IterableDataset:
    """Opens local files (one format) as a streaming dataset with a ``text`` column; one shard per file."""
    builders = {BUILDERS[f[f.rfind(".") :].lower()] for f in files}
    if len(builders) != 1:
        raise MLMAdaptError(
            f"{key}: data.streaming needs files of one format, got {', '.join(sorted(builders))}"
        )
    try:
        stream = datasets.load_dataset(builders.pop(), data_files=files, split="train", streaming=True)
    except Exception as exc:
        raise MLMAdaptError(f"{key}: could not stream {', '.join(files)}: {exc}") from exc
    return _text_only(stream, text_column)


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
    """

    def __init__(self, blocks: datasets.IterableDataset):
        self.blocks = blocks
        self.epoch = 0
        self._resumed = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            self.blocks.set_epoch(self.epoch)
            yielded = False
            for row in self.blocks:
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


def _tokenize(batch: dict[str, list], tokenizer: Any, segmenter: Any) -> dict:
    from mlm_adapt.text import tokenize_with_word_ids

    return tokenize_with_word_ids(batch["text"], tokenizer, segmenter)


def _pack(batch: dict[str, list], **kwargs: Any) -> dict:
    from mlm_adapt.text import build_blocks

    return build_blocks(batch["input_ids"], batch["word_ids"], **kwargs)


def to_blocks(
    stream: datasets.IterableDataset,
    tokenizer: Any,
    segmenter: Any,
    max_seq_length: int,
    packing: bool,
    features: datasets.Features,
) -> datasets.IterableDataset:
    """Lazy segmentation, tokenization and packing (documents of one ``map`` batch are packed together)."""
    tokenized = stream.map(
        _tokenize,
        batched=True,
        fn_kwargs={"tokenizer": tokenizer, "segmenter": segmenter},
        remove_columns=["text"],
    )
    kwargs = {
        "max_seq_length": max_seq_length,
        "cls_token_id": tokenizer.cls_token_id,
        "sep_token_id": tokenizer.sep_token_id,
        "packing": packing,
    }
    return tokenized.map(
        _pack, batched=True, fn_kwargs=kwargs, remove_columns=["input_ids", "word_ids"], features=features
    )


def setup(dm: MLMDataModule) -> None:
    """``MLMDataModule.setup`` for ``streaming=True``: opens the training stream, loads validation/test."""
    hp = dm.hparams
    if hp.dataset_name:
        try:
            raw = datasets.load_dataset(hp.dataset_name, hp.dataset_config, split="train", streaming=True)
        except Exception as exc:
            raise MLMAdaptError(f"data.dataset_name: could not stream {hp.dataset_name!r}: {exc}") from exc
        raw = _text_only(raw, hp.text_column)
    else:
        files = expand_files(hp.train_files, "data.train_files")
        raw = load_stream(files, "data.train_files", hp.text_column)
    splits: dict[str, datasets.Dataset] = {}
    for split, key in (("validation", "validation_files"), ("test", "test_files")):
        if hp[key]:
            splits[split] = dm._read_files(key)
    if "validation" in splits:
        dm.train_stream = split_text(raw, 0.0, hp.seed, held_out=False)
    else:
        # Every rank reads the same first held-out documents: a fixed, in-memory validation set.
        held_out = split_text(raw, hp.validation_split, hp.seed, held_out=True)
        texts = [row["text"] for row in held_out.take(hp.streaming_validation_documents)]
        if not texts:
            raise MLMAdaptError(
                "data.validation_split: no held-out document in the stream; "
                "raise it or set data.validation_files"
            )
        splits["validation"] = datasets.Dataset.from_dict({"text": texts})
        dm.train_stream = split_text(raw, hp.validation_split, hp.seed, held_out=False)
    blocks = dm._preprocess(datasets.DatasetDict(splits))
    dm.val_dataset = blocks["validation"]
    dm.test_dataset = blocks["test"] if "test" in blocks else blocks["validation"]
    dm.corpus_stats = {
        "validation_documents": len(splits["validation"]),
        "validation_examples": len(dm.val_dataset),
    }
    rank_zero_info(f"mlm_adapt data: streaming training data; {len(dm.val_dataset):,} validation blocks")


def train_dataloader(dm: MLMDataModule) -> DataLoader:
    """``MLMDataModule.train_dataloader`` for ``streaming=True``: this rank's endless, stateful stream."""
    from mlm_adapt.data import BLOCK_FEATURES  # data imports this module

    hp = dm.hparams
    trainer = dm.trainer
    if trainer is not None and trainer.max_steps < 0:
        raise MLMAdaptError("trainer.max_steps: set it when data.streaming is true (a stream has no length)")
    world_size, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
    shard = shard_for_rank(dm.train_stream, rank, world_size, hp.seed, hp.shuffle_buffer_size)
    blocks = to_blocks(shard, dm.tokenizer, dm.segmenter, hp.max_seq_length, hp.packing, BLOCK_FEATURES)
    return dm._loader(StreamingBlocks(blocks), hp.batch_size, stateful=True, collator=dm.train_collator)
