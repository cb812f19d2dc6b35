"""A resumed run continues its CSV log instead of wiping it, and a refused resume leaves it untouched.

Lightning's ``CSVLogger`` deletes ``metrics.csv`` when it opens a version directory that already has one
("Previous log files in this directory will be deleted"), which is right for a new run and wrong for a
resumed one. Resuming takes two steps so that nothing is written before every resume check has passed:
:func:`attach_csv_logs` (before the trainer opens its loggers) gives each ``CSVLogger`` a writer that
keeps the file and its header, writing nothing; :func:`drop_rows_after` (once the resume is accepted)
rewrites the file without the rows past the checkpoint's last logged step, which the resumed run logs
again. New rows are then appended by the logger as usual.
"""

from __future__ import annotations

import csv
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_only
from typing_extensions import override

from mlm_adapt.guard.outputs import Output, write_file

METRICS_FILE = "metrics.csv"


class _ContinuingWriter(ExperimentWriter):
    """Lightning's CSV writer without the deletion of an existing ``metrics.csv``; appends to it."""

    @override
    def _check_log_dir_exists(self) -> None:
        pass


def read_rows(metrics_csv: str | Path) -> tuple[list[str], list[dict[str, str]]]:
    """The header and the rows of a CSV log."""
    with open(metrics_csv, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def _step(row: dict[str, str]) -> int | None:
    try:
        return int(float(row.get("step") or 0))
    except ValueError:
        return None


def rows_up_to(metrics_csv: str | Path, step: int) -> list[dict[str, str]]:
    """The rows of a CSV log whose ``step`` is at most ``step`` (rows without a step are kept)."""
    return [row for row in read_rows(metrics_csv)[1] if (_step(row) or 0) <= step]


def _csv_logs(loggers: list[Logger]) -> list[tuple[CSVLogger, Path]]:
    if rank_zero_only.rank != 0:  # the CSV logger writes on rank 0 only
        return []
    found = []
    for logger in loggers:
        if isinstance(logger, CSVLogger):
            metrics_csv = Path(logger.log_dir) / METRICS_FILE
            if metrics_csv.is_file():
                found.append((logger, metrics_csv))
    return found


def attach_csv_logs(loggers: list[Logger]) -> list[Path]:
    """Makes every ``CSVLogger`` with a ``metrics.csv`` append to it instead of deleting it; writes nothing.

    Call before the trainer opens its loggers (before ``trainer.fit``).

    Returns:
        The attached ``metrics.csv`` files.
    """
    attached = []
    for logger, metrics_csv in _csv_logs(loggers):
        writer = _ContinuingWriter(log_dir=logger.log_dir)
        writer.metrics_keys = read_rows(metrics_csv)[0]
        logger._experiment = writer  # the property returns it instead of opening (and wiping) the file
        attached.append(metrics_csv)
    return attached


def drop_rows_after(loggers: list[Logger], step: int) -> list[Path]:
    """Removes the rows logged after ``step`` from every ``CSVLogger``'s ``metrics.csv``, atomically
    (:func:`mlm_adapt.guard.outputs.write_file`).

    Args:
        loggers: The trainer's loggers (others than ``CSVLogger`` are left alone: TensorBoard appends).
        step: The last logger step the checkpoint covers.

    Returns:
        The rewritten files (those with rows past ``step``).
    """
    rewritten = []
    for _, metrics_csv in _csv_logs(loggers):
        header, rows = read_rows(metrics_csv)
        kept = [row for row in rows if (_step(row) or 0) <= step]
        if len(kept) == len(rows):
            continue
        with (
            write_file(Output(metrics_csv, key="trainer.logger", directory=False)) as staged,
            open(staged, "w", newline="", encoding="utf-8") as handle,
        ):
            writer = csv.DictWriter(handle, fieldnames=header)
            writer.writeheader()
            writer.writerows(kept)
        rewritten.append(metrics_csv)
    return rewritten


def continue_csv_logs(loggers: list[Logger], step: int) -> list[Path]:
    """:func:`attach_csv_logs`, then :func:`drop_rows_after` ``step``: for callers with no check between.

    Returns:
        The continued ``metrics.csv`` files.
    """
    attached = attach_csv_logs(loggers)
    drop_rows_after(loggers, step)
    return attached
