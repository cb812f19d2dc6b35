"""The commands over a fit config that build only the DataModule.

- ``preview``: training examples exactly as the collator masks them (the same DataModule as ``fit``).
- ``prepare``: the corpus segmented, tokenized and packed once, on a CPU node; ``fit --data.prepared_dir
  DIR`` then reads only DIR (memory-mapped shards), and no rank waits on jieba.
- ``vocab``: the characters the model's vocabulary lacks (``[UNK]``; ``--output_tokens`` for
  ``model.new_tokens_file``) and the domain terms ``data.segmentation.segmenter`` splits, which whole-word
  masking therefore never masks whole (``--output_dict`` writes them as a jieba user dictionary for
  ``data.segmentation.user_dict``); see :mod:`mlm_adapt.text.tokenizer`.

Before the data module's stack is imported (LightningCLI's parser, torch, transformers, datasets), each
command answers ``--help`` with its own options (fit's are ``fit --help``) and refuses a ``data.train_files``
that names no file, as the data module would (:func:`check_corpus_files`).
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from jsonargparse import ArgumentParser

from mlm_adapt.cli.usage import OTHER_COMMANDS, PROG
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.outputs import Output, check_output, refuse_same_outputs, write_text
from mlm_adapt.text.files import expand_files

if TYPE_CHECKING:  # annotations only: torch and transformers are imported when a command runs
    import torch
    from transformers import PreTrainedTokenizerBase

# A command's own options, beside fit's config and options: ``(flag, type, default, help)``.
Options = list[tuple[str, Any, Any, str]]
PREVIEW_OPTIONS: Options = [
    ("--num_examples", int, 4, "How many training examples to show."),
    ("--format", Literal["text", "json"], "text", "text: annotated; json: one per line."),
]
PREPARE_OPTIONS: Options = [
    (
        "--shard",
        str | None,
        None,
        "TASK/TASKS: prepare only this task's share of the documents, as DIR/part-TASK-of-TASKS; fit reads "
        "DIR once all parts exist (scripts/slurm/prepare.sbatch: one task per array index).",
    )
]
VOCAB_OPTIONS: Options = [
    (
        "--output_dict",
        str | None,
        None,
        "Write the proposed terms as a jieba user dictionary (for data.segmentation.user_dict).",
    ),
    (
        "--output_tokens",
        str | None,
        None,
        "Write the top OOV characters, one per line (for model.new_tokens_file).",
    ),
    ("--min_count", int, 5, "Least count of a proposed term."),
    ("--min_cohesion", float, 3.0, "Least PMI (nats) between a term's parts."),
    ("--top_k", int, 30, "How many characters/terms to list."),
]
# The data settings that decide whether data.train_files is read (see check_corpus_files).
_CORPUS_KEYS = ("train_files", "dataset_name", "prepared_dir")


def print_help(command: str, options: Options) -> None:
    """``COMMAND --help``: the command's own options; fit's (its config too) are ``fit --help``'s."""
    summary = OTHER_COMMANDS[command]
    parser = ArgumentParser(
        prog=f"{PROG} {command}",
        description=(
            f"{summary[0].upper()}{summary[1:]}. Takes a fit config and every "
            f"option of fit besides the ones below (-c/--config FILE, --model.*, --data.*, --trainer.*; "
            f"listed by {PROG} fit --help); only the data module is built."
        ),
        exit_on_error=False,
    )
    for flag, type_, default, help_ in options:
        parser.add_argument(flag, type=type_, default=default, help=help_)
    parser.print_help()


def corpus_settings(args: list[str]) -> dict[str, Any] | None:
    """``data.train_files``, ``data.dataset_name`` and ``data.prepared_dir`` as ``args`` set them (flags and
    ``--config`` files, later over earlier, unset ones at their default ``None``); ``None`` where only the
    full parser can tell (a ``--data`` file or value, ``+=``, a config unreadable or not a mapping)."""
    found: dict[str, Any] = dict.fromkeys(_CORPUS_KEYS)
    i = 0
    while i < len(args):
        name, has_value, value = args[i].partition("=")
        key = name.removeprefix("--data.").removesuffix("+")
        i += 1
        if (
            name.startswith("--print_config")
            or name == "--data"
            or (key in _CORPUS_KEYS and name.endswith("+"))
        ):
            return None  # prints the config instead; a whole data section; an append to the list
        if name not in ("-c", "--config") and not (name.startswith("--data.") and key in _CORPUS_KEYS):
            continue
        if not has_value:
            if i >= len(args):
                return None
            value, i = args[i], i + 1
        try:
            if name in ("-c", "--config"):
                text = Path(value).read_text(encoding="utf-8")
                data = (yaml.safe_load(text) or {}).get("data", {})
                if not isinstance(data, dict):
                    return None
                found.update({k: data[k] for k in _CORPUS_KEYS if k in data})
            else:
                found[key] = yaml.safe_load(value)
        except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError, MLMAdaptError):
            return None  # the full parser reports it, in its words
    return found


def check_corpus_files(command: str, args: list[str]) -> None:
    """Refuses, before the data module's stack is imported, a ``data.train_files`` naming no file, in the
    data module's words: where the command reads it (no ``data.dataset_name``; for ``preview`` no
    ``data.prepared_dir`` either), and only where the command line alone tells (:func:`corpus_settings`)."""
    settings = corpus_settings(args)
    if settings is None or settings["dataset_name"]:
        return
    if command == "preview" and settings["prepared_dir"]:
        return  # preview reads the prepared blocks, not the files
    files = settings["train_files"]
    if isinstance(files, str) or (
        isinstance(files, list) and files and all(isinstance(f, str) for f in files)
    ):
        expand_files(files, "data.train_files")


def data_only_cli(command: str, args: list[str], options: Options) -> Any:
    """The command's :class:`~mlm_adapt.cli.fit.DataOnlyCLI` (config parsed, data module built), after its
    ``--help`` and the corpus check, which need neither."""
    if "-h" in args or "--help" in args:
        print_help(command, options)
        sys.exit(0)
    check_corpus_files(command, args)
    from mlm_adapt.cli.fit import DataOnlyCLI  # noqa: PLC0415 - the data module's stack, for this run only

    return DataOnlyCLI(args, options)


def batch_examples(batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase) -> Iterator[dict]:
    """Splits a collated batch into JSON-ready examples: ``tokens`` readable (``是``, not ``æĺ¯``),
    ``word_ids`` null on special and pad tokens; with replay, ``replayed`` (a general block)."""
    from mlm_adapt.text.tokenizer import piece_text  # noqa: PLC0415 - transformers: imported once preview runs

    for row in range(batch["input_ids"].shape[0]):
        input_ids = batch["input_ids"][row].tolist()
        word_ids = batch["word_ids"][row].tolist()
        example = {
            "tokens": [piece_text(tokenizer, i) for i in input_ids],
            "input_ids": input_ids,
            "attention_mask": batch["attention_mask"][row].tolist(),
            "labels": batch["labels"][row].tolist(),
            "word_ids": [None if w < 0 else w for w in word_ids],
        }
        if "replayed" in batch:
            example["replayed"] = bool(batch["replayed"][row])
        yield example


def render_text(example: dict, tokenizer: PreTrainedTokenizerBase) -> str:
    """One line per example: words separated by spaces, each masked word as ``【original→seen】``."""
    from mlm_adapt.text.tokenizer import join_pieces  # noqa: PLC0415 - transformers: imported once preview runs

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
    if example.get("replayed"):
        header += "; replayed general block (data.replay.files)"
    return header + "\n" + " ".join(parts)


def preview_main(args: list[str]) -> None:
    """Prints the first ``--num_examples`` training examples exactly as the collator masks them."""
    cli = data_only_cli("preview", args, PREVIEW_OPTIONS)
    datamodule, config = cli.datamodule, cli.config
    if config.num_examples < 1:
        raise MLMAdaptError(f"--num_examples={config.num_examples} must be at least 1")
    datamodule.setup("fit")
    tokenizer = datamodule.tokenizer
    batches = iter(datamodule.train_dataloader())
    if datamodule.replayer is not None:  # general blocks replayed as training's first step draws them
        batches = (datamodule.with_replay(batch, 0, 1) for batch in batches)
    examples = (e for batch in batches for e in batch_examples(batch, tokenizer))
    for example in itertools.islice(examples, config.num_examples):
        if config.format == "json":
            print(json.dumps(example, ensure_ascii=False))
        else:
            print(render_text(example, tokenizer) + "\n")


def prepare_main(args: list[str]) -> None:
    """Writes ``--data.prepared_dir`` from a fit config (progress bars, or phase lines when they are off)."""
    cli = data_only_cli("prepare", args, PREPARE_OPTIONS)
    from lightning.pytorch.utilities import rank_zero_info  # noqa: PLC0415 - loaded by the CLI above

    from mlm_adapt.data.prepared import parse_shard, part_name, prepare_corpus  # noqa: PLC0415
    from mlm_adapt.data.progress import Progress  # noqa: PLC0415
    from mlm_adapt.export.callback import hparams_inputs  # noqa: PLC0415

    datamodule, config = cli.datamodule, cli.config
    shard = parse_shard(config.shard) if config.shard is not None else None
    directory = config.data.prepared_dir
    if not directory:
        raise MLMAdaptError("data.prepared_dir: give the directory to write (--data.prepared_dir DIR)")
    if not config.data.train_files and not config.data.dataset_name:
        raise MLMAdaptError("data.train_files is empty; prepare needs the corpus (or data.dataset_name)")
    bars = config.trainer.get("enable_progress_bar") is not False
    inputs = hparams_inputs(config.get("model"), datamodule.hparams)
    inputs.pop("data.prepared_dir", None)  # fit's input is prepare's output (with --shard, a part's home)
    manifest = prepare_corpus(datamodule, directory, Progress("prepare", bars), shard, inputs)
    if manifest.get("skipped"):
        return
    written, then = directory, f"train with --data.prepared_dir {directory}"
    if shard is not None:
        written = str(Path(directory) / part_name(*shard))
        then += f" once all {shard[1]} parts exist" if shard[1] > 1 else ""
    train = manifest["splits"]["train"]
    size = sum(s["bytes"] for split in manifest["splits"].values() for s in split["shards"])
    rank_zero_info(
        f"mlm_adapt prepare: wrote {written} in {manifest['prepare_seconds']} s: "
        f"{train['documents']:,} documents, {train['characters']:,} characters, {train['blocks']:,} "
        f"training blocks ({train['tokens']:,} tokens) in {len(train['shards'])} shards, "
        f"{size / 2**20:,.1f} MiB; {then}"
    )


def vocab_main(args: list[str]) -> None:
    """Reports the corpus' ``[UNK]`` rate, OOV characters and candidate terms; writes them on demand."""
    cli = data_only_cli("vocab", args, VOCAB_OPTIONS)
    from mlm_adapt.export.callback import hparams_inputs  # noqa: PLC0415 - loaded by the CLI above
    from mlm_adapt.text.tokenizer import candidate_terms, cohesion, oov_characters, write_user_dict  # noqa: PLC0415

    config, datamodule = cli.config, cli.datamodule
    hp = datamodule.hparams
    # Checked before the corpus is read: an output must never replace the corpus or the model it reports on.
    inputs = hparams_inputs(config["model"].as_dict(), dict(hp))
    outputs = {
        name: Output(path, key=f"--{name}", directory=False, inputs=inputs)
        for name, path in (("output_dict", config.output_dict), ("output_tokens", config.output_tokens))
        if path
    }
    refuse_same_outputs(outputs.values())
    for output in outputs.values():
        check_output(output)
    texts = list(datamodule.train_documents()["text"])
    oov, unk_tokens, total = oov_characters(texts, datamodule.tokenizer)
    print(f"corpus: {len(texts):,} documents, {total:,} tokens; tokenizer {hp.tokenizer_name_or_path}")
    print(
        f"[UNK] rate: {unk_tokens / max(total, 1):.4%} "
        f"({unk_tokens:,} tokens, {len(oov):,} distinct OOV characters)"
    )
    if oov:
        print(f"\nmost frequent OOV characters (share of all [UNK]):\n{'char':<6}{'count':>8}{'share':>9}")
        for ch, n in oov.most_common(config.top_k):
            print(f"{ch:<6}{n:>8}{n / max(unk_tokens, 1):>9.1%}")
    if unk_tokens > sum(oov.values()):
        print(
            "(other [UNK]: words WordPiece cannot assemble from its pieces, e.g. a letter glued to a symbol)"
        )
    segmenter = datamodule.segmenter
    terms = candidate_terms(
        texts, datamodule.segmentation.user_dict, config.min_count, config.min_cohesion, segmenter
    )
    print(
        f"\n{len(terms):,} candidate terms (HMM words that {segmenter.name} splits, count >= "
        f"{config.min_count}, cohesion >= {config.min_cohesion}); top {min(config.top_k, len(terms))}:\n"
        f"{'term':<10}{'count':>8}{'cohesion':>10}"
    )
    corpus = "\n".join(texts)
    for word, n in terms.most_common(config.top_k):
        print(f"{word:<10}{n:>8}{cohesion(word, corpus):>10.2f}")
    if "output_dict" in outputs:
        write_user_dict(terms, outputs["output_dict"])
        print(f"\nwrote {len(terms):,} terms to {config.output_dict} (use it as data.segmentation.user_dict)")
    if "output_tokens" in outputs:
        chars = [ch for ch, _ in oov.most_common(config.top_k)]
        write_text(outputs["output_tokens"], "".join(f"{ch}\n" for ch in chars))
        print(f"wrote {len(chars):,} characters to {config.output_tokens} (use it as model.new_tokens_file)")
