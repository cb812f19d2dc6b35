"""A resumed run continues its CSV log instead of wiping it.

Lightning's ``CSVLogger`` deletes ``metrics.csv`` when it opens a version directory that already has one
("Previous log files in this directory will be deleted"), which is right for a new run and wrong for a
resumed one. :func:`continue_csv_logs` reads the rows first, opens the logger, and writes back the rows up
to the checkpoint's last logged step (later rows belong to steps the resumed run does again); the new rows
are then appended by the logger as usual.
"""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.utilities import rank_zero_only


def rows_up_to(metrics_csv: str | Path, step: int) -> list[dict[str, str]]:
    """The rows of a CSV log whose ``step`` is at most ``step`` (rows without a step are kept)."""
    with open(metrics_csv, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    kept = []
    for row in rows:
        try:
            if int(float(row.get("step") or 0)) > step:
                continue
        except ValueError:
            pass
        kept.append(row)
    return kept


def continue_csv_logs(loggers: list[Logger], step: int) -> list[Path]:
    """Makes every ``CSVLogger`` whose version directory has a ``metrics.csv`` continue it after ``step``.

    Call before the loggers write anything (before ``trainer.fit``).

    Args:
        loggers: The trainer's loggers (others than ``CSVLogger`` are left alone: TensorBoard appends).
        step: The last logger step the checkpoint covers (rows after it are dropped).

    Returns:
        The continued ``metrics.csv`` files.
    """
    continued: list[Path] = []
    if rank_zero_only.rank != 0:  # the CSV logger writes on rank 0 only
        return continued
    for logger in loggers:
        if not isinstance(logger, CSVLogger):
            continue
        metrics_csv = Path(logger.log_dir) / "metrics.csv"
        if not metrics_csv.is_file():
            continue
        rows = rows_up_to(metrics_csv, step)
        with warnings.catch_warnings():
            # Its "previous log files will be deleted" warning: the rows are written back right below.
            warnings.filterwarnings("ignore", message=".*exists and is not empty.*")
            writer = logger.experiment
        writer.metrics = [{k: v for k, v in row.items() if v not in ("", None)} for row in rows]
        writer.save()
        continued.append(metrics_csv)
    return continued
