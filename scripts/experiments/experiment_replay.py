"""Forgetting budgets on the demo: domain gain against general cost, with and without replay.

Adapts the demo's general model (``scripts/prepare_demo.py``: People's Daily -> product reviews) once per
setting, every run the demo's own ``fit`` (``configs/demo.yaml``) with one difference: no replay, a fixed
replay rate of general text (``data.replay.rate``), or a forgetting budget (``forgetting.budget``)
that moves the rate during the run. Prints one table: domain and general perplexity before and after,
the general rise over step 0, the share of the unconstrained run's domain reduction each run keeps, the
mean and final replay rate, and the wall time (the same-run baseline is the ``none`` row). Every run validates
six times, so the table also gives the general set's highest rise during the run (forgetting peaks before
the end when the run is long enough for the model to relearn general text from the domain one).

Usage: python scripts/experiments/experiment_replay.py [--steps 600] [--only none budget_0.2 ...]
(after ``python scripts/prepare_demo.py``). Results are in docs/results.md.
"""

from __future__ import annotations

import argparse
import csv
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GENERAL = ".cache/demo/general_train.txt"
RUNS = {
    "none": [],
    "fixed_0.2": [f"--data.replay.files=[{GENERAL}]", "--data.replay.rate=0.2"],
    "budget_0.5": [f"--data.replay.files=[{GENERAL}]", "--forgetting.budget=0.5"],
    "budget_0.2": [f"--data.replay.files=[{GENERAL}]", "--forgetting.budget=0.2"],
    "budget_0.1": [f"--data.replay.files=[{GENERAL}]", "--forgetting.budget=0.1"],
}
_ROW = re.compile(r"^(val(?:_general)?/perplexity)\s+([\d.]+)\s+([\d.]+)\s*$", re.M)
_RATE = re.compile(r"mean ([\d.]+); general perplexity")
_FINAL = re.compile(r"-> ([\d.]+) \(step \d+\); mean")
_WALL = re.compile(r"mlm_adapt fit: (\d+) s wall")


def run(name: str, extra: list[str], steps: int, root: Path) -> dict:
    """One ``fit`` of the demo config; the before/after perplexities and the replay line of its output."""
    command = [
        sys.executable, "-m", "mlm_adapt", "fit", "--config", "configs/demo.yaml",
        f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={max(1, steps // 6)}",
        f"--trainer.default_root_dir={root / name}", f"--export.output_dir={root / name / 'export'}",
        "--downstream.tasks=[]", "--trainer.enable_progress_bar=false", *extra,
    ]  # fmt: skip
    print("$", " ".join(command[1:]), flush=True)
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{name} failed:\n{result.stderr[-3000:]}")
    output = result.stdout + result.stderr
    rows = {m.group(1): (float(m.group(2)), float(m.group(3))) for m in _ROW.finditer(output)}
    rate, final = _RATE.search(output), _FINAL.search(output)
    fixed = next((float(a.split("=")[1]) for a in extra if a.startswith("--data.replay.rate")), 0.0)
    wall = _WALL.search(output)
    metrics = next((root / name).glob("csv/version_*/metrics.csv"))
    with open(metrics, encoding="utf-8") as handle:
        general = [
            float(r["val_general/perplexity"]) for r in csv.DictReader(handle) if r["val_general/perplexity"]
        ]
    return {
        "peak": max(general) / general[0] - 1,
        "domain": rows["val/perplexity"],
        "general": rows["val_general/perplexity"],
        "mean_rate": float(rate.group(1)) if rate else fixed,
        "final_rate": float(final.group(1)) if final else fixed,
        "wall": float(wall.group(1)) if wall else time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="Optimizer steps of every run.")
    parser.add_argument("--only", nargs="*", choices=list(RUNS), help="Runs to do (default: all).")
    parser.add_argument("--workdir", type=Path, default=REPO / "runs" / "replay")
    a = parser.parse_args()
    if not (REPO / GENERAL).is_file():
        sys.exit(f"{GENERAL} is missing: run python scripts/prepare_demo.py first")
    results = {name: run(name, RUNS[name], a.steps, a.workdir) for name in a.only or RUNS}
    reduction = None
    if "none" in results:
        before, after = results["none"]["domain"]
        reduction = before - after
    print(f"\n{a.steps} steps, demo config; perplexities before -> after (step 0 -> step {a.steps})")
    print(
        "| run | domain perplexity | general perplexity | general rise: end (peak) | domain reduction kept "
        "| mean / final replay rate | wall |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    base_wall = results.get("none", {}).get("wall")
    for name, r in results.items():
        (d0, d1), (g0, g1) = r["domain"], r["general"]
        kept = f"{(d0 - d1) / reduction:.0%}" if reduction else "n/a"
        wall = f"{r['wall']:.0f} s" + (f" ({r['wall'] / base_wall:.2f}x)" if base_wall else "")
        print(
            f"| {name} | {d0:,.1f} -> {d1:,.1f} | {g0:,.1f} -> {g1:,.1f} "
            f"| {g1 / g0 - 1:+.1%} ({r['peak']:+.1%}) | {kept} "
            f"| {r['mean_rate']:.3f} / {r['final_rate']:g} | {wall} |"
        )


if __name__ == "__main__":
    main()
