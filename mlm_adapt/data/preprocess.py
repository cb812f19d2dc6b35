"""The ``datasets`` pipeline from documents to blocks, shared by in-memory and streaming corpora.

One batched ``map`` step does it all: segment, tokenize with word ids, pack into blocks. Per batch of
documents it works on flat arrays (:func:`~mlm_adapt.text.tokens.tokenize_flat`,
:func:`~mlm_adapt.text.blocks.pack_blocks`) and, for in-memory datasets, hands ``datasets`` an Arrow table
built from them: no Python list per token, document or block on the way in or out, and one process pool per
split instead of one per step. Packing restarts at each ``map`` batch (``datasets``' default of 1,000
documents), which is what ``prepare --shard`` aligns its shares to.
"""

from __future__ import annotations

from typing import Any, TypeVar

import datasets
import numpy as np
import pyarrow as pa
from transformers import PreTrainedTokenizerBase

from mlm_adapt.text.blocks import PackedBlocks, pack_blocks
from mlm_adapt.text.segmentation import WordSegmenter
from mlm_adapt.text.tokens import TOKENIZATION_VERSION, tokenize_flat
from mlm_adapt.text.vocabulary import block_special_ids

BLOCK_FEATURES = datasets.Features(
    {"input_ids": datasets.List(datasets.Value("int32")), "word_ids": datasets.List(datasets.Value("int32"))}
)

AnyDataset = TypeVar("AnyDataset", datasets.Dataset, datasets.IterableDataset, datasets.DatasetDict)


def is_non_empty(batch: dict[str, list]) -> list[bool]:
    """``filter`` predicate: documents with some non-space text."""
    return [bool(text and text.strip()) for text in batch["text"]]


def drop_empty(dataset: datasets.Dataset, name: str) -> datasets.Dataset:
    """``dataset`` without documents that hold no text (``name`` labels the progress bar)."""
    return dataset.filter(is_non_empty, batched=True, desc=f"Dropping empty lines ({name})")


def blocks_table(packed: PackedBlocks, features: datasets.Features = BLOCK_FEATURES) -> pa.Table:
    """Blocks as an Arrow table of ``features`` (list columns straight from the arrays).

    The cast to narrower integer types (``prepare``'s ``uint16``/``int16``) is checked: an id that does not
    fit raises instead of wrapping around.
    """
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
    return pack_blocks(
        tokens.ids,
        tokens.units,
        tokens.counts,
        max_seq_length,
        start_id,
        end_id,
        packing,
        document_delimiters,
    )


def _blocks_arrow(
    batch: pa.Table, features: datasets.Features = BLOCK_FEATURES, version: int = 0, **kwargs: Any
) -> pa.Table:
    # ``version`` is unused here: it only enters datasets' cache fingerprint (TOKENIZATION_VERSION).
    return blocks_table(documents_to_blocks(batch.column("text").to_pylist(), **kwargs), features)


def _blocks_lists(batch: dict[str, list], version: int = 0, **kwargs: Any) -> dict[str, list[list[int]]]:
    return documents_to_blocks(batch["text"], **kwargs).to_lists()


def to_blocks(
    documents: AnyDataset,
    tokenizer: PreTrainedTokenizerBase,
    segmenter: WordSegmenter,
    max_seq_length: int,
    packing: bool,
    document_delimiters: bool = False,
    features: datasets.Features = BLOCK_FEATURES,
    **map_kwargs: Any,
) -> AnyDataset:
    """Segments, tokenizes and packs a ``text`` column into ``input_ids``/``word_ids`` blocks.

    Args:
        documents: Documents with a ``text`` column (in memory or streamed).
        tokenizer: The model's tokenizer.
        segmenter: The word segmenter.
        max_seq_length: Block length, special tokens included.
        packing: Concatenate documents into full blocks (else one document per block or blocks).
        document_delimiters: Packed documents each get their own ``[CLS] ... [SEP]`` (document attention).
        features: The integer types of the block columns in memory (``prepare`` writes narrower ones).
        map_kwargs: Extra ``map`` arguments for in-memory datasets (``num_proc``).
    """
    fn_kwargs = {
        "tokenizer": tokenizer,
        "segmenter": segmenter,
        "version": TOKENIZATION_VERSION,
        "max_seq_length": max_seq_length,
        "packing": packing,
        "document_delimiters": document_delimiters and packing,
    }
    if isinstance(documents, datasets.IterableDataset):
        return documents.map(_blocks_lists, fn_kwargs=fn_kwargs, batched=True, remove_columns=["text"])
    # Arrow in, Arrow out: the batch's text column is read once and the blocks never become Python lists.
    blocks = documents.with_format("arrow").map(
        _blocks_arrow,
        fn_kwargs={**fn_kwargs, "features": features},
        batched=True,
        remove_columns=["text"],
        features=features,
        desc="Segmenting, tokenizing and packing" if packing else "Segmenting, tokenizing and splitting",
        **map_kwargs,
    )
    return blocks.with_format(None)
