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


@pytest.mark.parametrize(
    ("flag", "conflict"),
    [
        ("--data.masking.scheme=token", "data.masking.scheme: 'whole_word' -> 'token'"),
        ("--data.masking.mlm_probability=0.3", "data.masking.mlm_probability: 0.15 -> 0.3"),
        ("--seed_everything=7", "seed_everything: 42 -> 7"),
    ],
)
def test_a_resume_that_would_draw_or_mask_other_examples_is_refused(
    trained_run, tiny_model_dir, tmp_path, monkeypatch, capsys, flag, conflict
):
    """Before, each was accepted: data.seed pointed the saved position into another permutation (already
    trained rows drawn again), data.masking.scheme made the card say the run used token masking."""
    last = trained_run / "checkpoints" / "last.ckpt"
    args = tiny_fit_args(tiny_model_dir, trained_run / "reviews.txt", tmp_path, "--trainer.max_steps=8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as refused:
        main(["fit", *args, f"--ckpt_path={last}", flag])
    assert refused.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == (
        f"mlm_adapt: error: ckpt_path: cannot resume {last} with changed settings ({conflict}); they are "
        "fixed by the checkpoint: drop the changed flags to resume, or start a new run from an export "
        "(model.model_name_or_path=EXPORT_DIR) to train with them"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written (the run lock removed)


@pytest.mark.slow
def test_a_streamed_corpus_reshuffled_under_the_same_name_and_size_is_refused(
    tiny_model_dir, review_texts, tmp_path
):
    corpus = tmp_path / "corpus" / "reviews.txt"
    corpus.parent.mkdir()
    texts = [f"{i:04d} {text}" for i, text in enumerate(review_texts)]
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    root = tmp_path / "run"
    streamed = (
        "--data.streaming.enabled=true",
        "--data.blocks.packing=false",
        "--trainer.limit_val_batches=1",
    )
    checkpoint = ("--trainer.callbacks+=ModelCheckpoint", f"--trainer.callbacks.dirpath={root / 'ckpt'}")
    checkpoint += ("--trainer.callbacks.save_last=true",)

    def fit(*extra: str):
        return run_cli("fit", *tiny_fit_args(tiny_model_dir, corpus, root, *streamed, *checkpoint, *extra))

    first = fit("--trainer.max_steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    size = corpus.stat().st_size
    corpus.write_text("\n".join(texts[1::2] + texts[::2]) + "\n", encoding="utf-8")
    assert corpus.stat().st_size == size
    refused = fit("--trainer.max_steps=4", "--ckpt_path=last", "--export.overwrite=true")
    assert refused.returncode == 2, refused.stderr[-3000:]
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith(f"mlm_adapt: error: ckpt_path: cannot resume {root / 'ckpt' / 'last.ckpt'} with ")
    assert "(training corpus: fingerprint " in line, line
