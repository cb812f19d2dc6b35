"""Progress of long commands: a tqdm bar as Lightning's, or one line per phase when bars are off.

Cluster jobs pass ``--trainer.enable_progress_bar false``: carriage-return bars would fill their log files,
yet minutes of silence look like a hang. With bars off, every phase still logs one line with its duration
(``mlm_adapt prepare: train shards written in 12.3 s``), and ``datasets``' own bars are silenced too.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

import datasets
from lightning.pytorch.utilities import rank_zero_info
from tqdm.auto import tqdm

Item = TypeVar("Item")


class Progress:
    """Bars (``bars=True``) or one line per phase with its duration (``bars=False``).

    Args:
        command: The command's name, the prefix of every line (``prepare``, ``export``).
        bars: Show tqdm bars; ``False`` logs phase lines instead (``trainer.enable_progress_bar``).
    """

    def __init__(self, command: str, bars: bool = True):
        self.command = command
        self.bars = bars

    def log(self, message: str) -> None:
        """One ``mlm_adapt <command>: message`` line (rank 0 only)."""
        rank_zero_info(f"mlm_adapt {self.command}: {message}")

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Times a phase; without bars, logs ``<name> ...`` at its start and ``<name> done in X s`` after.

        ``datasets``' progress bars follow ``bars`` inside the phase.
        """
        silenced = not self.bars and not datasets.are_progress_bars_disabled()
        if silenced:
            datasets.disable_progress_bars()
        if not self.bars:
            self.log(f"{name} ...")
        start = time.perf_counter()
        try:
            yield
        finally:
            if silenced:
                datasets.enable_progress_bars()
        if not self.bars:
            self.log(f"{name} done in {time.perf_counter() - start:.1f} s")

    def bar(
        self, items: Iterable[Item], total: int | None = None, desc: str = "", unit: str = "it"
    ) -> Iterable[Item]:
        """``items`` wrapped in a tqdm bar when bars are on, else unchanged."""
        if not self.bars:
            return items
        return tqdm(items, total=total, desc=desc, unit=unit, dynamic_ncols=True, leave=True)
