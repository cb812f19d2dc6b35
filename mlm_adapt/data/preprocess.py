"""The ``datasets`` pipeline from documents to blocks, shared by in-memory and streaming corpora.

Both ``datasets.Dataset`` (cached by fingerprint) and ``datasets.IterableDataset`` (lazy) run the same two
batched ``map`` steps: segment + tokenize with word ids, then pack into blocks.
"""

from __future__ import annotations

from typing import Any, TypeVar

import datasets
from lightning.pytorch.utilities import rank_zero_warn
from transformers import PreTrainedTokenizerBase

from mlm_adapt.text.blocks import build_blocks
from mlm_adapt.text.tokens import TOKENIZATION_VERSION, tokenize_with_word_ids
from mlm_adapt.text.vocabulary import block_special_ids
from mlm_adapt.text.word_segmenter import WordSegmenter

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


def _tokenize_batch(
    batch: dict[str, list], tokenizer: PreTrainedTokenizerBase, segmenter: WordSegmenter, version: int = 0
) -> dict:
    # ``version`` is unused here: it only enters datasets' cache fingerprint (TOKENIZATION_VERSION).
    return tokenize_with_word_ids(batch["text"], tokenizer, segmenter)


def _blocks_batch(batch: dict[str, list], **kwargs: Any) -> dict:
    return build_blocks(batch["input_ids"], batch["word_ids"], **kwargs)


def to_blocks(
    documents: AnyDataset,
    tokenizer: PreTrainedTokenizerBase,
    segmenter: WordSegmenter,
    max_seq_length: int,
    packing: bool,
    document_delimiters: bool = False,
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
        map_kwargs: Extra ``map`` arguments for in-memory datasets (``num_proc``).
    """
    in_memory = not isinstance(documents, datasets.IterableDataset)
    start_id, end_id = block_special_ids(tokenizer)
    tokenized = documents.map(
        _tokenize_batch,
        fn_kwargs={"tokenizer": tokenizer, "segmenter": segmenter, "version": TOKENIZATION_VERSION},
        batched=True,
        remove_columns=["text"],
        **({"desc": "Segmenting and tokenizing", **map_kwargs} if in_memory else {}),
    )
    return tokenized.map(
        _blocks_batch,
        fn_kwargs={
            "max_seq_length": max_seq_length,
            "cls_token_id": start_id,
            "sep_token_id": end_id,
            "packing": packing,
            # Only when set: the cache fingerprint of the default blocks stays what it was.
            **({"document_delimiters": True} if document_delimiters and packing else {}),
        },
        batched=True,
        remove_columns=["input_ids", "word_ids"],
        features=BLOCK_FEATURES,
        **(
            {"desc": "Packing blocks" if packing else "Splitting long lines", **map_kwargs}
            if in_memory
            else {}
        ),
    )


def mix_documents(
    domain: datasets.Dataset, general: datasets.Dataset, probability: float, seed: int
) -> datasets.Dataset:
    """Interleaves general documents into the domain ones so that ``probability`` of all are general.

    Every domain document is kept; general ones are drawn (seeded, without replacement) to make up the
    share, and all of them are used when there are too few (with a warning naming ``data.mix_files``).
    """
    wanted = round(len(domain) * probability / (1 - probability))
    if len(general) < wanted:
        rank_zero_warn(
            f"data.mix_files: {len(general)} documents, fewer than the {wanted} that data.mix_probability="
            f"{probability} asks for; all of them are mixed in"
        )
    general = general.shuffle(seed=seed).select(range(min(wanted, len(general))))
    # Without replacement: every document of both sources appears exactly once, in a seeded interleaving.
    return datasets.interleave_datasets(
        [domain, general],
        probabilities=[1 - probability, probability],
        seed=seed,
        stopping_strategy="all_exhausted_without_replacement",
    )
