"""A Lightning callback for benchmarks: appends ``time.perf_counter()`` at every training batch end to a file.

Passed to the real command line: ``--trainer.callbacks+=_bench_clock.StepClock --trainer.callbacks.path=F``
(``scripts/benchmarks/`` on ``PYTHONPATH``).
"""

from __future__ import annotations

import time

import lightning as L


class StepClock(L.Callback):
    """Writes one timestamp per optimizer step to ``path``."""

    def __init__(self, path: str):
        self.path = path
        self.times: list[float] = []

    def on_train_batch_end(self, *args, **kwargs) -> None:
        self.times.append(time.perf_counter())

    def on_train_end(self, *args, **kwargs) -> None:
        with open(self.path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(f"{t:.6f}" for t in self.times))
