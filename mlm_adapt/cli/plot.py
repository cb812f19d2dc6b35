"""``python -m mlm_adapt plot RUN_DIR``: loss, accuracy and perplexity curves from a run's CSV log."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from jsonargparse import auto_cli

from mlm_adapt.errors import MLMAdaptError

# (panel title, [(column, label)]) of the figure; columns absent from the log are skipped.
PANELS = (
    ("loss", [("train/loss", "train"), ("val/loss", "validation")]),
    ("accuracy (masked)", [("val/accuracy", "token"), ("val/word_accuracy", "word")]),
    ("perplexity", [("val/perplexity", "validation")]),
)


def find_metrics(run_dir: str | Path) -> Path:
    """The newest ``metrics.csv`` under ``run_dir`` (a CSVLogger version directory or any parent of it)."""
    run_dir = Path(run_dir)
    if run_dir.is_file() and run_dir.name.endswith(".csv"):
        return run_dir
    found = sorted(run_dir.rglob("metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise MLMAdaptError(
            f"plot: no metrics.csv under {run_dir}; log with lightning.pytorch.loggers.CSVLogger "
            "(trainer.logger) and give its save_dir or version directory"
        )
    return found[-1]


def plot_metrics(metrics_csv: str | Path, output: str | Path, title: str | None = None) -> Path:
    """Draws the curves of ``metrics_csv`` (one row per logging step) into the PNG ``output``."""
    # Heavy and only needed here; the backend must be chosen before pyplot is imported.
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt  # noqa: PLC0415

    frame = pd.read_csv(metrics_csv)
    if "step" not in frame.columns:
        raise MLMAdaptError(f"plot: {metrics_csv} has no 'step' column; is it a Lightning CSVLogger log?")
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.2))
    for ax, (name, columns) in zip(axes, PANELS, strict=True):
        for column, label in columns:
            if column in frame.columns:
                series = frame[["step", column]].dropna()
                ax.plot(
                    series["step"],
                    series[column],
                    marker="o" if len(series) < 30 else None,
                    ms=3,
                    label=label,
                )
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=80)
    plt.close(fig)
    return output


def plot(run_dir: str, output: str | None = None, title: str | None = None) -> None:
    """Draws loss, accuracy and perplexity curves from a run's CSV log.

    Args:
        run_dir: A run directory (searched for the newest metrics.csv) or a metrics.csv.
        output: PNG to write (default: curves.png next to metrics.csv).
        title: Figure title.
    """
    metrics = find_metrics(run_dir)
    print(f"wrote {plot_metrics(metrics, output or metrics.parent / 'curves.png', title)}")


def plot_main(args: list[str]) -> None:
    """``python -m mlm_adapt plot RUN_DIR [--output PNG] [--title T]``."""
    auto_cli(plot, args=args, prog="python -m mlm_adapt plot", exit_on_error=False)
