"""``fit --ckpt_path last`` through the CLI with the shipped configs' layout: versioned CSV logs and a
``ModelCheckpoint`` without ``dirpath`` (configs/demo.yaml). It must resume, not start over."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from conftest import run_cli, tiny_fit_args

from mlm_adapt.cli import main

# As in configs/demo.yaml: a CSVLogger with versions, a ModelCheckpoint that writes into the logger's version.
LOGGER = (
    '{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "%s", "name": "csv"}}'
)
CHECKPOINT = (
    '{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", '
    '"init_args": {"monitor": "val/loss", "mode": "min", "save_last": true}}'
)


def fit_args(model_dir: Path, corpus: Path, root: Path, *extra: str) -> list[str]:
    return tiny_fit_args(
        model_dir,
        corpus,
        root,
        "--trainer.val_check_interval=2",
        f"--trainer.logger={LOGGER % root}",
        f"--trainer.callbacks+={CHECKPOINT}",
        f"--export.output_dir={root / 'export'}",
        "--export.overwrite=true",
        *extra,
    )


def fit(model_dir: Path, corpus: Path, root: Path, *extra: str):
    return run_cli("fit", *fit_args(model_dir, corpus, root, *extra), cwd=root)


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def logged_steps(metrics_csv: Path, column: str) -> list[int]:
    with open(metrics_csv, newline="", encoding="utf-8") as handle:
        return [int(row["step"]) for row in csv.DictReader(handle) if row.get(column)]


@pytest.mark.slow
def test_ckpt_path_last_resumes_the_run_across_logger_versions(
    tiny_model_dir, corpus_file, tmp_path, monkeypatch, capsys
):
    root = tmp_path / "run"
    root.mkdir()
    first = fit(tiny_model_dir, corpus_file, root, "--trainer.max_steps=4")
    assert first.returncode == 0, first.stderr[-3000:]
    version = root / "csv" / "version_0"
    last = version / "checkpoints" / "last.ckpt"
    saved = load(last)
    assert saved["global_step"] == 4 and saved["mlm_adapt_baseline_metrics"]

    changed = ("--trainer.max_steps=6", "--ckpt_path=last", "--data.batch_size=4")
    monkeypatch.chdir(root)  # in-process: the refusal needs no interpreter of its own
    with pytest.raises(SystemExit) as refused:
        main(["fit", *fit_args(tiny_model_dir, corpus_file, root, *changed)])
    assert refused.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.strip().splitlines()[-1].startswith("mlm_adapt: error: ckpt_path: cannot resume")
    assert "data.batch_size: 8 -> 4" in stderr and "Traceback" not in stderr
    assert sorted(p.name for p in (root / "csv").iterdir()) == ["version_0"]

    resumed = fit(tiny_model_dir, corpus_file, root, "--trainer.max_steps=6", "--ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Restored all states from the checkpoint at {last}" in resumed.stderr
    assert sorted(p.name for p in (root / "csv").iterdir()) == ["version_0"]  # its logs continue
    continued = load(last)
    assert continued["global_step"] == 6  # its step count continues
    assert continued["mlm_adapt_baseline_metrics"] == saved["mlm_adapt_baseline_metrics"]  # and its baseline
    val_steps = logged_steps(version / "metrics.csv", "val/loss")
    # The baseline and the validations at steps 2 and 4 (first run) and 6 (resumed), once each, in order.
    assert len(val_steps) == 4 and val_steps == sorted(set(val_steps))
    card = (root / "export" / "README.md").read_text(encoding="utf-8")
    assert f"| val/loss | {saved['mlm_adapt_baseline_metrics']['val/loss']:.4f} |" in card
