"""Progress of long work (``prepare``, ``export``, downstream evaluation): tqdm bars, or phase lines.

Cluster jobs pass ``--trainer.enable_progress_bar false``: carriage-return bars would fill their logs, yet
minutes of silence look like a hang. Without bars every phase logs a line at its start and one with its
duration (a counted phase: one line with its count), and the bars of ``datasets`` and ``huggingface_hub``
are silenced too.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import datasets
import huggingface_hub.utils as hub_utils
from lightning.pytorch.utilities import rank_zero_info
from tqdm.auto import tqdm

Item = TypeVar("Item")


@contextlib.contextmanager
def _library_bars(enabled: bool) -> Iterator[None]:
    """``datasets``' and ``huggingface_hub``'s own bars off when ``enabled`` is false, restored after."""
    silenced = (
        [] if enabled else [lib for lib in (datasets, hub_utils) if not lib.are_progress_bars_disabled()]
    )
    for library in silenced:
        library.disable_progress_bars()
    try:
        yield
    finally:
        for library in silenced:
            library.enable_progress_bars()


class Progress:
    """Tqdm bars, or (``bars=False``: ``trainer.enable_progress_bar``) one line per phase with its duration,
    prefixed by ``command`` (``prepare``, ``export``, ``downstream``) and sent to ``sink`` (default: rank 0's
    log; ``None``: nowhere)."""

    def __init__(self, command: str, bars: bool = True, sink: Callable[[str], None] | None = rank_zero_info):
        self.command = command
        self.bars = bars
        self.sink = sink
        self._stage_bar: tqdm | None = None

    def log(self, message: str) -> None:
        """One ``mlm_adapt <command>: message`` line."""
        if self.sink is not None:
            self.sink(f"mlm_adapt {self.command}: {message}")

    def note(self, message: str) -> None:
        """A line that bars make redundant: logged only when bars are off."""
        if not self.bars:
            self.log(message)

    @contextlib.contextmanager
    def counted(self, what: str, total: int, unit: str) -> Iterator[Callable[[int], None]]:
        """A phase of ``total`` ``unit``: yields the function that advances its bar by a count; without
        bars, one line with the count and the duration at its end."""
        start = time.perf_counter()
        with tqdm(
            total=total, desc=what, unit=f" {unit}", leave=False, dynamic_ncols=True, disable=not self.bars
        ) as bar:
            yield bar.update
        self.note(f"{what}: {total:,} {unit} in {time.perf_counter() - start:.1f} s")

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
        """``items`` wrapped in a tqdm bar (disabled when bars are off)."""
        return tqdm(items, total=total, desc=desc, unit=unit, dynamic_ncols=True, disable=not self.bars)


SILENT = Progress("downstream", bars=False, sink=None)
