"""Progress of a downstream evaluation: a bar per phase when the trainer shows bars, else one line per phase
with its counts and duration, so that a long evaluation is never minutes of silence."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tqdm.auto import tqdm


class Progress:
    """Reports phases (feature extraction, probe fit, fine-tuning steps, prediction).

    Args:
        log: Where one line per finished phase goes (e.g. ``rank_zero_info``); none: silent.
        bar: Show a tqdm bar for each phase instead of the lines (as Lightning's progress bar does).
    """

    def __init__(self, log: Callable[[str], None] | None = None, bar: bool = False):
        self.log = log
        self.bar = bar

    def line(self, message: str) -> None:
        """One line (not shown while bars are on: the bars say it)."""
        if self.log is not None and not self.bar:
            self.log(f"mlm_adapt downstream: {message}")

    @contextmanager
    def phase(self, what: str, total: int, unit: str) -> Iterator[Callable[[int], None]]:
        """A phase of ``total`` ``unit``; yields the function that advances it by a count."""
        start = time.perf_counter()
        bar = (
            tqdm(total=total, desc=what, unit=f" {unit}", leave=False, dynamic_ncols=True)
            if self.bar
            else None
        )
        try:
            yield bar.update if bar is not None else (lambda count: None)
        finally:
            if bar is not None:
                bar.close()
        seconds = time.perf_counter() - start
        self.line(f"{what}: {total:,} {unit} in {seconds:.1f} s")


SILENT = Progress()
