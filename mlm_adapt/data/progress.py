"""Progress of long commands: a tqdm bar as Lightning's, or one line per phase when bars are off.

Cluster jobs pass ``--trainer.enable_progress_bar false``: carriage-return bars would fill their log files,
yet minutes of silence look like a hang. With bars off, every phase still logs one line at its start and one
with its duration (``mlm_adapt prepare: writing train shards done in 12.3 s``), and the bars of
``datasets`` and ``huggingface_hub`` (uploads) are silenced too.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

import datasets
import huggingface_hub.utils as hub_utils
from lightning.pytorch.utilities import rank_zero_info
from tqdm.auto import tqdm

Item = TypeVar("Item")


@contextlib.contextmanager
def _library_bars(enabled: bool) -> Iterator[None]:
    """``datasets``' and ``huggingface_hub``'s own bars off when ``enabled`` is false, restored after."""
    silenced = []
    if not enabled:
        if not datasets.are_progress_bars_disabled():
            datasets.disable_progress_bars()
            silenced.append(datasets.enable_progress_bars)
        if not hub_utils.are_progress_bars_disabled():
            hub_utils.disable_progress_bars()
            silenced.append(hub_utils.enable_progress_bars)
    try:
        yield
    finally:
        for enable in silenced:
            enable()


class Progress:
    """Bars (``bars=True``) or one line per phase with its duration (``bars=False``).

    Args:
        command: The command's name, the prefix of every line (``prepare``, ``export``).
        bars: Show tqdm bars; ``False`` logs phase lines instead (``trainer.enable_progress_bar``).
    """

    def __init__(self, command: str, bars: bool = True):
        self.command = command
        self.bars = bars
        self._stage_bar: tqdm | None = None

    def log(self, message: str) -> None:
        """One ``mlm_adapt <command>: message`` line (rank 0 only)."""
        rank_zero_info(f"mlm_adapt {self.command}: {message}")

    @contextlib.contextmanager
    def stages(self, total: int, desc: str) -> Iterator[None]:
        """One bar over ``total`` phases (each :meth:`phase` inside advances it) when bars are on."""
        if not self.bars:
            yield
            return
        self._stage_bar = tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True)
        try:
            yield
        finally:
            self._stage_bar.close()
            self._stage_bar = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Times a phase; without bars, logs ``<name> ...`` at its start and ``<name> done in X s`` after."""
        if self._stage_bar is not None:
            self._stage_bar.set_postfix_str(name)
        if not self.bars:
            self.log(f"{name} ...")
        start = time.perf_counter()
        with _library_bars(self.bars):
            yield
        if self._stage_bar is not None:
            self._stage_bar.update(1)
        if not self.bars:
            self.log(f"{name} done in {time.perf_counter() - start:.1f} s")

    def bar(
        self, items: Iterable[Item], total: int | None = None, desc: str = "", unit: str = "it"
    ) -> Iterable[Item]:
        """``items`` wrapped in a tqdm bar when bars are on, else unchanged."""
        if not self.bars:
            return items
        return tqdm(items, total=total, desc=desc, unit=unit, dynamic_ncols=True)
