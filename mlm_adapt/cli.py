"""``python -m mlm_adapt``: LightningCLI for fit/validate/test, plus the ``preview`` command."""

from __future__ import annotations

import sys
from collections.abc import Callable

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from mlm_adapt.data import MLMDataModule
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.model import MaskedLMModule

EVAL_METRICS = ("val/loss", "val/accuracy", "val/word_accuracy", "val/perplexity")


class MLMAdaptCLI(LightningCLI):
    """LightningCLI with the tokenizer and sequence length linked from the model to the data."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("seed_everything_default", 42)
        super().__init__(MaskedLMModule, MLMDataModule, *args, **kwargs)

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("model.model_name_or_path", "data.tokenizer_name_or_path")
        parser.link_arguments("model.max_seq_length", "data.max_seq_length")
        parser.link_arguments("model.new_tokens_file", "data.new_tokens_file")

    def before_fit(self) -> None:
        """Validates the unadapted model first: the step-0 domain baseline, logged and kept in checkpoints."""
        if self.config_init[self.subcommand].get("ckpt_path"):
            return  # resuming: the model is no longer the unadapted one
        self.trainer.validate(self.model, datamodule=self.datamodule, verbose=False)
        self.model.baseline_metrics = {
            k: float(v) for k, v in self.trainer.callback_metrics.items() if k in EVAL_METRICS
        }

    def after_fit(self) -> None:
        """Prints the before/after validation metrics."""
        before = self.model.baseline_metrics
        after = {k: float(v) for k, v in self.trainer.callback_metrics.items() if k in EVAL_METRICS}
        if not before or not after:
            return
        lines = ["", f"{'metric':<16}{'before':>12}{'after':>12}"]
        lines += [f"{k:<16}{before[k]:>12.4f}{after[k]:>12.4f}" for k in EVAL_METRICS if k in before and k in after]
        rank_zero_info("\n".join(lines))


def _run(entry: Callable[[list[str]], object], args: list[str]) -> None:
    try:
        entry(args)
    except MLMAdaptError as exc:
        print(f"mlm_adapt: error: {exc}", file=sys.stderr)
        sys.exit(2)


def main(args: list[str] | None = None) -> None:
    """Entry point of ``python -m mlm_adapt`` and the ``mlm-adapt`` script."""
    args = list(sys.argv[1:] if args is None else args)
    commands: dict[str, Callable[[list[str]], object]] = {}
    from mlm_adapt.plot import plot_main
    from mlm_adapt.preview import preview_main
    from mlm_adapt.vocab import vocab_main

    commands["preview"] = preview_main
    commands["vocab"] = vocab_main
    commands["plot"] = plot_main
    if args and args[0] in commands:
        _run(commands[args[0]], args[1:])
    else:
        _run(lambda a: MLMAdaptCLI(args=a), args)
