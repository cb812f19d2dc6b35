"""``python -m mlm_adapt prepare``: segment, tokenize and pack the corpus once, for every rank and node.

Run it on a CPU node with the training config; then ``fit --data.prepared_dir DIR`` on the GPU nodes reads
only DIR (memory-mapped shards), never the raw files, and no rank waits on jieba.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from mlm_adapt.cli.preview import DataOnlyCLI
from mlm_adapt.data.prepared import parse_shard, part_name, prepare_corpus
from mlm_adapt.data.progress import Progress
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.export.callback import hparams_inputs


class PrepareCLI(DataOnlyCLI):
    """The fit config plus ``--shard``."""

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_argument(
            "--shard",
            type=str | None,
            default=None,
            help="TASK/TASKS: prepare only this task's share of the documents, as DIR/part-TASK-of-TASKS; "
            "fit reads DIR once all parts exist (scripts/slurm/prepare.sbatch: one task per array index).",
        )


def prepare_main(args: list[str]) -> None:
    """Writes ``--data.prepared_dir`` from a fit config (progress bars, or phase lines when they are off)."""
    cli = PrepareCLI(args=args, run=False, save_config_callback=None)
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
