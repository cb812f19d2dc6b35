"""Benchmark-only callback: wall time of every training step and of the hooks around checkpoint writes.

Passed to the CLI as ``--trainer.callbacks+=_step_timer.StepTimer`` with ``scripts/benchmarks/`` on
PYTHONPATH.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import lightning as L


class StepTimer(L.Callback):
    """Writes ``{"steps": [s, ...], "events": {hook: t}}`` to ``out_file`` at the end of fit.

    Args:
        out_file: Where to write the JSON.
    """

    def __init__(self, out_file: str):
        self.out_file = Path(out_file)
        self.steps: list[float] = []
        self.events: dict[str, float] = {}
        self._start = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps.append(time.perf_counter() - self._start)

    def on_validation_start(self, trainer, pl_module) -> None:
        self.events.setdefault("validation_start", []).append(time.perf_counter())

    def on_validation_end(self, trainer, pl_module) -> None:
        # Runs before ModelCheckpoint's own on_validation_end (Lightning runs checkpoint callbacks last).
        self.events.setdefault("validation_end", []).append(time.perf_counter())

    def on_train_end(self, trainer, pl_module) -> None:
        self.events["train_end"] = time.perf_counter()
        # The last downstream evaluation's seconds (logged by DownstreamEvaluation), when tasks are set.
        downstream = trainer.callback_metrics.get("downstream/time_s")
        if trainer.is_global_zero:
            record = {"steps": self.steps, "events": self.events}
            if downstream is not None:
                record["downstream_s"] = float(downstream)
            self.out_file.write_text(json.dumps(record))
