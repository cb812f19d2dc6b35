"""``python -m mlm_adapt preview``: what the model will see.

Built from the same DataModule and collator as ``fit``, so what it shows is what training gets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Literal

import torch
from lightning.pytorch.cli import LightningArgumentParser
from transformers import PreTrainedTokenizerBase
from typing_extensions import override

from mlm_adapt.cli.fit import MLMAdaptCLI
from mlm_adapt.data import MLMDataModule
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.tokenizer import join_pieces, piece_text


def batch_examples(batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase) -> Iterator[dict]:
    """Splits a collated batch into JSON-ready examples (``word_ids`` null on special and pad tokens).

    ``tokens`` are readable pieces (:func:`~mlm_adapt.text.tokenizer.piece_text`: ``是``, not ``æĺ¯``).
    """
    for row in range(batch["input_ids"].shape[0]):
        input_ids = batch["input_ids"][row].tolist()
        word_ids = batch["word_ids"][row].tolist()
        yield {
            "tokens": [piece_text(tokenizer, i) for i in input_ids],
            "input_ids": input_ids,
            "attention_mask": batch["attention_mask"][row].tolist(),
            "labels": batch["labels"][row].tolist(),
            "word_ids": [None if w < 0 else w for w in word_ids],
        }


def render_text(example: dict, tokenizer: PreTrainedTokenizerBase) -> str:
    """One line per example: words separated by spaces, each masked word as ``【original→seen】``."""
    words: list[tuple[int | None, list[int]]] = []  # (word id, positions)
    for pos, (word, attended) in enumerate(zip(example["word_ids"], example["attention_mask"], strict=True)):
        if not attended:
            break
        if word is not None and words and words[-1][0] == word:
            words[-1][1].append(pos)
        else:
            words.append((word, [pos]))
    labels, input_ids = example["labels"], example["input_ids"]
    parts, n_masked_words, n_masked = [], 0, 0
    for _, positions in words:
        # Decoded per word, so byte-level pieces of one character print as that character.
        shown = join_pieces(tokenizer, [input_ids[p] for p in positions])
        predicted = [p for p in positions if labels[p] != -100]
        if predicted:
            # A piece without a label (an [UNK] is never a target) was left as is: its input is the original.
            original_ids = [labels[p] if labels[p] != -100 else input_ids[p] for p in positions]
            original = join_pieces(tokenizer, original_ids)
            parts.append(f"【{original}→{shown}】")
            n_masked_words += 1
            n_masked += len(predicted)
        else:
            parts.append(shown)
    length = sum(example["attention_mask"])
    rate = n_masked / max(length - 2, 1)
    header = f"# {length} tokens, {n_masked} masked ({rate:.1%}) in {n_masked_words} words"
    return header + "\n" + " ".join(parts)


class DataOnlyCLI(MLMAdaptCLI):
    """Parses a fit config (with ``--data.*``/``--model.*`` overrides) and builds only the DataModule."""

    @override
    def instantiate_classes(self) -> None:
        # The model and trainer are not needed to see the data; loading them would cost time and memory.
        self.datamodule = MLMDataModule(**self.config["data"].as_dict())


class PreviewCLI(DataOnlyCLI):
    """The fit config plus ``--num_examples`` and ``--format``."""

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_argument("--num_examples", type=int, default=4, help="How many training examples to show.")
        parser.add_argument(
            "--format",
            type=Literal["text", "json"],
            default="text",
            help="text: annotated; json: one per line.",
        )


def preview_main(args: list[str]) -> None:
    """Prints the first ``--num_examples`` training examples exactly as the collator masks them."""
    cli = PreviewCLI(args=args, run=False, save_config_callback=None)
    datamodule, config = cli.datamodule, cli.config
    if config.num_examples < 1:
        raise MLMAdaptError(f"--num_examples={config.num_examples} must be at least 1")
    datamodule.setup("fit")
    tokenizer = datamodule.tokenizer
    shown = 0
    for batch in datamodule.train_dataloader():
        for example in batch_examples(batch, tokenizer):
            if shown == config.num_examples:
                return
            if config.format == "json":
                print(json.dumps(example, ensure_ascii=False))
            else:
                print(render_text(example, tokenizer) + "\n")
            shown += 1
