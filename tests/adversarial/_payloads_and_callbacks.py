"""What the loading and signal suites hand to the CLI: a pickle payload and a callback.

Importable as ``_payloads_and_callbacks`` (pytest puts this directory on ``sys.path``), so LightningCLI can
instantiate the callback below from ``--trainer.callbacks+=``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import lightning as L


class CreatesMarker:
    """Unpickling this runs code: it creates ``path`` (what an attacker's payload would do instead)."""

    def __init__(self, path: Path | str):
        self.path = str(path)

    def __reduce__(self):
        return exec, (f"open({self.path!r}, 'w').close()",)


class SignalWhileSegmenting:
    """A segmenter that sends ``signum`` to its process at its first batch: a stop while ``fit`` prepares the
    corpus (data.preprocessing_num_workers 1: in the command's own process)."""

    def __init__(self, signum: int = int(signal.SIGTERM)):
        self.signum = signum

    def segment(self, texts: list[str]) -> list[list[str]]:
        os.kill(os.getpid(), self.signum)
        return [list(text) for text in texts]


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
