"""``python -m mlm_adapt``: LightningCLI (fit/validate/test) plus preview, export, fill-mask, vocab, plot."""

from __future__ import annotations

import sys
from collections.abc import Callable

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from typing_extensions import override

from mlm_adapt.callbacks import HFExport
from mlm_adapt.data import MLMDataModule
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.export import metrics_table
from mlm_adapt.model import EVAL_METRICS, MaskedLMModule
from mlm_adapt.scale import default_callbacks


class MLMAdaptCLI(LightningCLI):
    """LightningCLI with the tokenizer and sequence length linked from the model to the data."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault(
            "parser_kwargs",
            {
                "prog": "python -m mlm_adapt",
                "description": "Domain-adaptive whole-word-masking MLM pretraining of Chinese BERT-family "
                "models. Trainer commands below; also: preview, export, fill-mask, vocab, plot "
                "(python -m mlm_adapt COMMAND --help).",
            },
        )
        kwargs.setdefault("seed_everything_default", 42)
        # The optimizer comes from model.optimizer, so the no-decay groups and schedule always apply.
        kwargs.setdefault("auto_configure_optimizers", False)
        # Persistent callbacks (appended to any configured ones): exact resume + global batch summary.
        kwargs.setdefault("trainer_defaults", {"callbacks": default_callbacks()})
        super().__init__(MaskedLMModule, MLMDataModule, *args, **kwargs)

    @staticmethod
    @override
    def subcommands() -> dict[str, set[str]]:
        # A masked LM has no prediction loop here: fill-mask is the inference command.
        return {k: v for k, v in LightningCLI.subcommands().items() if k != "predict"}

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("model.model_name_or_path", "data.tokenizer_name_or_path")
        parser.link_arguments("model.max_seq_length", "data.max_seq_length")
        parser.link_arguments("model.new_tokens_file", "data.new_tokens_file")
        # Always present (``export:`` in YAML, ``--export.*`` flags); ``export.enabled: false`` turns it off.
        parser.add_lightning_class_args(HFExport, "export")

    def before_fit(self) -> None:
        """Validates the unadapted model first: the step-0 domain baseline, logged and kept in checkpoints."""
        if self.config_init[self.subcommand].get("ckpt_path"):
            return  # resuming: the model is no longer the unadapted one
        self.trainer.validate(self.model, datamodule=self.datamodule, verbose=False)
        self.model.baseline_metrics = {
            k: float(v) for k, v in self.trainer.callback_metrics.items() if k in EVAL_METRICS
        }

    def after_fit(self) -> None:
        """Prints the before/after validation metrics, validating the final weights if not done yet."""
        if self.model.last_validated_step != self.trainer.global_step:
            self.trainer.validate(self.model, datamodule=self.datamodule, verbose=False)
        after = {k: float(v) for k, v in self.trainer.callback_metrics.items() if k in EVAL_METRICS}
        if self.model.baseline_metrics and after and self.trainer.is_global_zero:
            print(metrics_table(self.model.baseline_metrics, after))


def _run(entry: Callable[[list[str]], object], args: list[str]) -> None:
    try:
        entry(args)
    except MLMAdaptError as exc:
        print(f"mlm_adapt: error: {exc}", file=sys.stderr)
        sys.exit(2)


def main(args: list[str] | None = None) -> None:
    """Entry point of ``python -m mlm_adapt`` and the ``mlm-adapt`` script."""
    args = list(sys.argv[1:] if args is None else args)
    # Imported here: preview/vocab import this module (for the CLI parser) and would import it circularly.
    from mlm_adapt.export import export_main
    from mlm_adapt.fill_mask import fill_mask_main
    from mlm_adapt.plot import plot_main
    from mlm_adapt.preview import preview_main
    from mlm_adapt.vocab import vocab_main

    commands: dict[str, Callable[[list[str]], object]] = {
        "preview": preview_main,
        "export": export_main,
        "fill-mask": fill_mask_main,
        "vocab": vocab_main,
        "plot": plot_main,
    }
    if args and args[0] in commands:
        _run(commands[args[0]], args[1:])
    else:
        # LightningCLI reads sys.argv itself; passing it again only triggers its "args and argv" warning.
        _run(lambda a: MLMAdaptCLI(args=None if a == sys.argv[1:] else a), args)
