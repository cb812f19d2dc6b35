"""``python -m mlm_adapt export``: a checkpoint of ``fit`` as a Hugging Face directory (and the Hub)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

import transformers
from jsonargparse import ArgumentParser

from mlm_adapt.data.progress import Progress
from mlm_adapt.export.callback import export_checkpoint
from mlm_adapt.export.writer import ExportOptions
from mlm_adapt.model.metrics import metrics_table


@dataclass(kw_only=True, eq=False)
class ExportCommand(ExportOptions):
    """Writes a checkpoint of fit as a Hugging Face directory: safetensors weights, the tokenizer,
    training_config.yaml and a README.md model card with the before/after validation metrics; the directory is
    reloaded with AutoModelForMaskedLM/AutoTokenizer and its logits compared with the checkpoint's.

    Args:
        ckpt_path: Checkpoint file (.ckpt: single device, DDP, FSDP full) or FSDP sharded directory.
        output_dir: Directory to write; must be empty or absent, or an earlier export with --overwrite.
        base_model: Base model directory or Hub name, if the one recorded in the checkpoint is not available
            here (its config and tokenizer are used; the weights come from the checkpoint).
        progress_bar: Show progress bars; false (batch jobs) logs one line per phase with its duration.
    """

    ckpt_path: str
    output_dir: str
    base_model: str | None = None
    progress_bar: bool = True


def bare_flags(args: list[str], options: type) -> list[str]:
    """Lets boolean options be given as bare flags: ``--overwrite`` -> ``--overwrite=true``.

    jsonargparse expects a value after a boolean option; the commands document ``--overwrite`` and
    ``--push_to_hub`` as flags, as users write them.
    """
    names = {
        f"--{n}" for n, p in inspect.signature(options).parameters.items() if p.annotation in (bool, "bool")
    }
    out = []
    for i, arg in enumerate(args):
        value_follows = i + 1 < len(args) and args[i + 1].lower() in ("true", "false")
        out.append(f"{arg}=true" if arg in names and not value_follows else arg)
    return out


def export_main(args: list[str]) -> None:
    """Parses the options, exports, and prints the files, the reload check and the before/after table."""
    parser = ArgumentParser(
        prog="python -m mlm_adapt export",
        description=ExportCommand.__doc__.split("\n")[0],
        exit_on_error=False,
    )
    parser.add_class_arguments(ExportCommand)
    command = ExportCommand(**parser.parse_args(bare_flags(args, ExportCommand)).as_dict())
    transformers.logging.disable_progress_bar()
    progress = Progress("export", bars=command.progress_bar)
    result = export_checkpoint(command.ckpt_path, command.output_dir, command, command.base_model, progress)
    output_dir = Path(command.output_dir)
    files = sorted(p.name for p in output_dir.iterdir() if not p.name.startswith("."))
    print(f"wrote {output_dir}: {', '.join(files)}")
    if result.logit_difference is not None:
        print(
            "reload check: AutoModelForMaskedLM logits match the checkpoint "
            f"(max |difference| {result.logit_difference:.2e})"
        )
    info = result.info
    step = info.final_metrics_step
    print(
        metrics_table(info.baseline_metrics, info.final_metrics) + (f"\n(after: step {step})" if step else "")
    )
    if result.hub_url:
        print(f"pushed to {result.hub_url}")
