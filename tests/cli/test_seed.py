"""One seed for the run: ``--seed_everything`` changes every draw of the run (the held-out split, the order
of the examples, their masks, dropout), and the same seed gives the same run."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import run_main, tiny_fit_args


def _data_args(model_dir, corpus_file, root) -> list[str]:
    return [a for a in tiny_fit_args(model_dir, corpus_file, root) if a.startswith(("--model", "--data"))]


def _masks(model_dir, corpus_file, root, seed: int, capsys) -> list[list[int]]:
    """The labels (the masks) of the first training examples, as ``preview`` shows them."""
    args = _data_args(model_dir, corpus_file, root)
    code, out, err = run_main(
        ["preview", *args, f"--seed_everything={seed}", "--num_examples=6", "--format=json"], capsys
    )
    assert code == 0, err[-2000:]
    return [json.loads(line)["labels"] for line in out.splitlines() if line.startswith("{")]


def test_the_seed_sets_the_masks_and_the_order(tiny_model_dir, corpus_file, tmp_path, capsys):
    first = _masks(tiny_model_dir, corpus_file, tmp_path / "a", 1, capsys)
    assert len(first) == 6
    assert _masks(tiny_model_dir, corpus_file, tmp_path / "b", 1, capsys) == first
    assert _masks(tiny_model_dir, corpus_file, tmp_path / "c", 2, capsys) != first


def test_data_seed_is_no_option_of_its_own(tiny_model_dir, corpus_file, tmp_path, capsys):
    args = tiny_fit_args(tiny_model_dir, corpus_file, tmp_path, "--data.seed=7")
    code, _, err = run_main(["fit", *args], capsys)
    lines = [line for line in err.splitlines() if line.startswith("mlm_adapt: error:")]
    assert code == 2 and lines == [
        "mlm_adapt: error: data.seed: it is set from seed_everything; give seed_everything instead"
    ]


def _losses(model_dir, corpus_file, root, seed: int, capsys) -> list[str]:
    """The training loss of every step of a 3-step fit and its validation loss, as logged."""
    logger = ["--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={root}"]
    args = tiny_fit_args(
        model_dir,
        corpus_file,
        root,
        *logger,
        f"--seed_everything={seed}",
        "--trainer.max_steps=3",
        "--trainer.log_every_n_steps=1",
        "--export.checkpoint=none",
    )
    code, _, err = run_main(["fit", *args], capsys)
    assert code == 0, err[-2000:]
    (metrics,) = root.rglob("metrics.csv")
    rows = list(csv.DictReader(metrics.open(encoding="utf-8")))
    return [r[k] for r in rows for k in ("train/loss", "val/loss") if r.get(k)]


@pytest.mark.slow
def test_the_seed_sets_the_losses(tiny_model_dir, corpus_file, tmp_path, capsys):
    first = _losses(tiny_model_dir, corpus_file, tmp_path / "a", 1, capsys)
    assert len(first) >= 4  # three steps and the validations
    assert _losses(tiny_model_dir, corpus_file, tmp_path / "b", 1, capsys) == first
    other = _losses(tiny_model_dir, corpus_file, tmp_path / "c", 2, capsys)
    assert len(other) == len(first) and all(a != b for a, b in zip(first, other, strict=True))


def test_a_data_module_built_in_python_keeps_its_own_seed_whatever_ran_before(
    tiny_model_dir, corpus_file, tmp_path, monkeypatch
):
    """A prepared directory of the CLI (seed 42) was refused by a Python-built data module after the
    process had been seeded otherwise: the data seed must not be read from the environment."""
    from conftest import make_datamodule

    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    assert make_datamodule(tiny_model_dir, corpus_file, tmp_path).seed == 42


def test_seed_everything_true_seeds_the_data_with_the_number_drawn(tiny_model_dir, corpus_file, tmp_path):
    from mlm_adapt.cli.fit import DataOnlyCLI

    args = [*_data_args(tiny_model_dir, corpus_file, tmp_path), "--seed_everything=true"]
    cli = DataOnlyCLI(args, [])
    drawn = cli.config.seed_everything
    assert isinstance(drawn, int) and not isinstance(drawn, bool)
    assert cli.datamodule.seed == drawn
