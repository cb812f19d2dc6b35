"""Exporting any checkpoint ``fit`` wrote (``python -m mlm_adapt export``): the same directory and card."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlm_adapt.data import MLMDataModule
from mlm_adapt.data.progress import Progress
from mlm_adapt.data.replay import replay_summary
from mlm_adapt.export.callback import HFExport, hparams_inputs
from mlm_adapt.export.card import ExportInfo, val_metrics_at
from mlm_adapt.export.writer import ExportOptions, check_hub_access, push_folder, write_export
from mlm_adapt.guard.outputs import Output, check_output
from mlm_adapt.model.checkpoints import (
    callback_state,
    checkpoint_metadata,
    load_checkpoint,
    module_from_checkpoint,
    tokenizer_for,
)


@dataclass
class ExportResult:
    """What :func:`export_checkpoint` did: the card's facts, the reload check and the Hub commit."""

    info: ExportInfo
    logit_difference: float | None
    hub_url: str | None


def export_checkpoint(
    ckpt_path: str,
    output_dir: str,
    options: ExportOptions,
    base_model: str | None = None,
    progress: Progress | None = None,
) -> ExportResult:
    """Writes a checkpoint of ``fit`` as a Hugging Face directory (and optionally pushes it to the Hub).

    The card's before/after metrics, corpus statistics and config come from what the run stored in the
    checkpoint (the module's baseline, ``HFExport``'s state).

    Args:
        ckpt_path: Checkpoint file or FSDP sharded checkpoint directory.
        output_dir: Directory to write.
        options: What to write and where to upload.
        base_model: Base model directory or Hub name, if the one recorded in the checkpoint is not here.
        progress: Bars, or one line per phase with its duration (default: bars).
    """
    progress = progress or Progress("export")
    # The checkpoint, a local base model and what the run read (as the checkpoint records it: the model it
    # started from above all) must survive the export, whatever overwrite says. The metadata is read
    # without the weights, so a refused output costs nothing.
    saved = checkpoint_metadata(ckpt_path, key="--ckpt_path")
    recorded = hparams_inputs(saved.get("hyper_parameters"), saved.get("datamodule_hyper_parameters"))
    inputs = {
        "--ckpt_path": [ckpt_path],
        "--base_model": [base_model] if base_model else [],
        **{f"{key} in the checkpoint": paths for key, paths in recorded.items()},
    }
    output = Output(output_dir, key="--output_dir", overwrite=options.overwrite, inputs=inputs)
    check_output(output)
    if options.push_to_hub:
        check_hub_access(options.repo_id)
    with progress.phase(f"loading {ckpt_path}"):
        checkpoint = load_checkpoint(ckpt_path)
        module = module_from_checkpoint(checkpoint, base_model)
    tokenizer = tokenizer_for(checkpoint, base_model)
    state = callback_state(checkpoint, HFExport.__qualname__)
    history = {int(k): v for k, v in (state.get("val_history") or {}).items()}
    final, final_step = val_metrics_at(history, checkpoint.get("global_step"))
    info = ExportInfo(
        model_hparams=dict(checkpoint.get("hyper_parameters") or {}),
        data_hparams=dict(checkpoint.get("datamodule_hyper_parameters") or {}),
        baseline_metrics=module.baseline_metrics,
        final_metrics=final,
        final_metrics_step=final_step,
        corpus_stats=dict(state.get("corpus_stats") or {}),
        config_yaml=state.get("config_yaml"),
        source=f"checkpoint {ckpt_path}",
        global_step=checkpoint.get("global_step"),
        epoch=checkpoint.get("epoch"),
        license=options.license,
        tags=list(options.tags),
        repo_id=options.repo_id if options.push_to_hub else None,
        replay=replay_summary((checkpoint.get(MLMDataModule.__qualname__) or {}).get("replay")),
    )
    diff = write_export(module.model, tokenizer, output, info, verify=options.verify, progress=progress)
    url = None
    if options.push_to_hub:
        with progress.phase(f"uploading to the Hub ({options.repo_id})"):
            url = push_folder(
                Path(output_dir), options.repo_id, options.private, options.revision, options.commit_message
            )
    return ExportResult(info, diff, url)
