"""A resumed run's CSV log keeps the rows up to the checkpoint instead of being wiped."""

from __future__ import annotations

import csv

from lightning.pytorch.loggers import CSVLogger

from mlm_adapt.training.checkpoint_files import attach_csv_logs, drop_rows_after


def read(path):
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_csv_log_continues_at_the_checkpoint_step(tmp_path):
    first = CSVLogger(tmp_path, name="csv")
    for step in range(1, 11):
        first.log_metrics({"train/loss": 10.0 - step}, step=step)
    first.log_metrics({"val/loss": 4.5}, step=4)
    first.save()
    metrics = tmp_path / "csv" / "version_0" / "metrics.csv"
    assert len(read(metrics)) == 11

    resumed = CSVLogger(tmp_path, name="csv", version=0)
    assert attach_csv_logs([resumed]) == [metrics]  # the CLI's two steps: attach, then drop once accepted
    drop_rows_after([resumed], step=4)
    resumed.log_metrics({"train/loss": 0.5, "train/lr": 1e-3}, step=5)  # a new column, too
    resumed.save()
    rows = read(metrics)
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 4, 5]
    assert rows[4]["val/loss"] == "4.5" and rows[5]["train/lr"] == "0.001" and rows[0]["train/loss"] == "9.0"
