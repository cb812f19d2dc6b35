"""User code that the loading, signal and stop suites hand to the CLI: a pickle payload and callbacks.

Importable as ``_payloads_and_callbacks`` (pytest puts this directory on ``sys.path``; the subprocess tests
add it to ``PYTHONPATH``), so LightningCLI can instantiate the callbacks below from ``--trainer.callbacks+=``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import lightning as L


class CreatesMarker:
    """Unpickling this runs code: it creates ``path`` (what an attacker's payload would do instead)."""

    def __init__(self, path: Path | str):
        self.path = str(path)

    def __reduce__(self):
        return exec, (f"open({self.path!r}, 'w').close()",)


class SendSignalAt(L.Callback):
    """Sends ``signum`` to this process at the end of training batch ``batch_idx`` (or at ``hook``).

    Args:
        signum: The signal number.
        batch_idx: The batch at whose end it is sent (``hook == "batch"``).
        hook: ``batch`` or ``train_end`` (after the last step, during the end-of-training callbacks).
    """

    def __init__(self, signum: int = int(signal.SIGTERM), batch_idx: int = 1, hook: str = "batch"):
        self.signum = signum
        self.batch_idx = batch_idx
        self.hook = hook

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.hook == "batch" and batch_idx == self.batch_idx:
            os.kill(os.getpid(), self.signum)

    def on_train_end(self, trainer, pl_module):
        if self.hook == "train_end":
            os.kill(os.getpid(), self.signum)


class SlowSteps(L.Callback):
    """Sleeps after every training batch and records the step reached in ``progress`` (JSON), so a test can
    signal a subprocess in the middle of its run."""

    def __init__(self, progress: str, seconds: float = 0.3):
        self.progress = progress
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        tmp = self.progress + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump({"step": trainer.global_step, "pid": os.getpid()}, handle)
        os.replace(tmp, self.progress)
        time.sleep(self.seconds)
