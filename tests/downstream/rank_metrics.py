"""Test-only callback: writes the ``downstream/*`` metrics each rank sees after every validation.

Passed to the CLI as ``--trainer.callbacks+=tests.downstream.rank_metrics.RankMetrics`` (run_cli puts the
repo on PYTHONPATH); the DDP test compares the ranks' files with each other and with a single-process
evaluation of the same weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L


class RankMetrics(L.Callback):
    """Appends ``{"step": N, "metrics": {...}}`` per validation to ``out_dir/rank{R}.jsonl``.

    Args:
        out_dir: Directory for the per-rank files.
    """

    def __init__(self, out_dir: str):
        self.out_dir = Path(out_dir)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("downstream/")}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / f"rank{trainer.global_rank}.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": trainer.global_step, "metrics": metrics}) + "\n")
