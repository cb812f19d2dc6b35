"""``python -m mlm_adapt COMMAND``: one registry of commands, used for dispatch and for ``--help``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NamedTuple

from mlm_adapt.cli.export import export_main
from mlm_adapt.cli.fill_mask import fill_mask_main
from mlm_adapt.cli.fit import MLMAdaptCLI
from mlm_adapt.cli.plot import plot_main
from mlm_adapt.cli.preview import preview_main
from mlm_adapt.cli.vocab import vocab_main
from mlm_adapt.errors import MLMAdaptError


class Command(NamedTuple):
    """A command besides LightningCLI's own (fit, validate, test)."""

    run: Callable[[list[str]], object]
    summary: str


COMMANDS: dict[str, Command] = {
    "preview": Command(preview_main, "print training examples exactly as the collator masks them"),
    "export": Command(export_main, "write a checkpoint as a Hugging Face directory (and push it to the Hub)"),
    "fill-mask": Command(fill_mask_main, "top-k predictions and whole-word fillings of [MASK] runs"),
    "vocab": Command(vocab_main, "report [UNK] characters and candidate jieba terms of the corpus"),
    "plot": Command(plot_main, "draw loss/accuracy/perplexity curves of a run's metrics.csv"),
}


def description() -> str:
    """The top-level ``--help`` text: what the tool does and every command beyond fit/validate/test."""
    others = "; ".join(f"{name}: {command.summary}" for name, command in COMMANDS.items())
    return (
        "Domain-adaptive whole-word-masking MLM pretraining of Chinese BERT-family models. "
        f"Trainer commands below; also {others} (python -m mlm_adapt COMMAND --help)."
    )


def _run(entry: Callable[[list[str]], object], args: list[str]) -> None:
    try:
        entry(args)
    except MLMAdaptError as exc:
        print(f"mlm_adapt: error: {exc}", file=sys.stderr)
        sys.exit(2)


def _fit_cli(args: list[str]) -> None:
    # LightningCLI reads sys.argv itself; passing it again only triggers its "args and argv" warning.
    MLMAdaptCLI(
        args=None if args == sys.argv[1:] else args,
        parser_kwargs={"prog": "python -m mlm_adapt", "description": description()},
    )


def main(args: list[str] | None = None) -> None:
    """Entry point of ``python -m mlm_adapt`` and the ``mlm-adapt`` script."""
    args = list(sys.argv[1:] if args is None else args)
    if args and args[0] in COMMANDS:
        _run(COMMANDS[args[0]].run, args[1:])
    else:
        _run(_fit_cli, args)
