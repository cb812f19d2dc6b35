"""``python -m mlm_adapt plot RUN_DIR``: loss, accuracy and perplexity curves from a run's CSV log."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jsonargparse import auto_cli

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.outputs import Output, check_output, write_file

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


def image_format(output: str | Path, key: str = "--output") -> str:
    """The image format of ``output`` by its suffix (``png`` without one), refusing one matplotlib lacks."""
    # Heavy and only needed here.
    from matplotlib.backend_bases import FigureCanvasBase  # noqa: PLC0415

    suffix = Path(output).suffix.lower().lstrip(".") or "png"
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix not in formats:
        raise MLMAdaptError(
            f"{key}: {output}: matplotlib cannot draw .{suffix} files; use .png, .pdf or .svg "
            f"(or {', '.join(sorted(formats))})"
        )
    return suffix


def plot_metrics(metrics_csv: str | Path, output: str | Path | Output, title: str | None = None) -> Path:
    """Draws the curves of ``metrics_csv`` (a CSVLogger log) into the image ``output`` (format by suffix; an
    :class:`~mlm_adapt.guard.outputs.Output` or a path), titled ``title``."""
    output = output if isinstance(output, Output) else Output(output, key="--output", directory=False)
    output = dataclasses.replace(output, directory=False, inputs={**output.inputs, "run_dir": [metrics_csv]})
    real = check_output(output)  # before any work: never onto the log it reads
    image = image_format(output.path, output.key)
    # Heavy and only needed here; the backend must be chosen before pyplot is imported.
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt  # noqa: PLC0415
    import pandas as pd  # noqa: PLC0415 - heavy and only needed here (plot --help answers at once)

    try:
        frame = pd.read_csv(metrics_csv)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        reason = (
            "it is empty" if isinstance(exc, pd.errors.EmptyDataError) else "it is not a readable CSV file"
        )
        raise MLMAdaptError(
            f"plot: {metrics_csv}: {reason}; give the metrics.csv of a run that logged (CSVLogger)"
        ) from None
    if "step" not in frame.columns:
        raise MLMAdaptError(f"plot: {metrics_csv} has no 'step' column; is it a Lightning CSVLogger log?")
    if frame.empty:
        raise MLMAdaptError(f"plot: {metrics_csv} has a header but no rows yet; plot after the run logged")
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.2))
    for ax, (name, columns) in zip(axes, PANELS, strict=True):
        for column, label in columns:
            if column in frame.columns:
                series = frame[["step", column]].dropna()
                marker = "o" if len(series) < 30 else None
                ax.plot(series["step"], series[column], marker=marker, ms=3, label=label)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        with write_file(output) as staged:
            fig.savefig(staged, dpi=80, format=image)
    finally:
        plt.close(fig)
    return real


def plot(run_dir: str, output: str | None = None, title: str | None = None) -> None:
    """Draws loss, accuracy and perplexity curves from a run's CSV log.

    Args:
        run_dir: A run directory (searched for the newest metrics.csv) or a metrics.csv.
        output: PNG to write (default: curves.png next to metrics.csv).
        title: Figure title.
    """
    metrics = find_metrics(run_dir)
    # A path the user gives is theirs to point anywhere; the default one lies in a run directory others may
    # write to, so a link planted there is replaced by the image, never written through.
    target = Output(
        output or metrics.parent / "curves.png", key="--output", directory=False, follow_link=bool(output)
    )
    plot_metrics(metrics, target, title)
    print(f"wrote {target.path}")


def plot_main(args: list[str]) -> None:
    """``python -m mlm_adapt plot RUN_DIR [--output PNG] [--title T]``."""
    auto_cli(plot, args=args, prog="python -m mlm_adapt plot", exit_on_error=False)
