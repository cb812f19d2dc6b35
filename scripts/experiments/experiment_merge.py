"""Merging toward the base at export on the demo, without and with replay: what the merge keeps and costs.

Runs the demo's own ``fit`` (``configs/demo.yaml``, 200 steps) four times: no replay; no replay and
``--export.merge_budget``; replay under ``--forgetting.budget``; replay under the budget and the merge. Each
export is then scored by an independent ``validate`` of the exported directory with the demo config (the same
validation sets and batches ``fit`` scored), and so is the base model. Prints one table: α, domain and general
perplexity of each export, the general rise over the base, the share of the domain reduction of the same
training's unmerged export that the merge keeps, the search's own seconds (printed by ``fit``) and the fit's
wall time against its unmerged twin (the same-run baseline).

Usage: python scripts/experiments/experiment_merge.py [--budget 0.2]
(after ``python scripts/prepare_demo.py``). Results are in docs/benchmarks.md and README.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GENERAL = ".cache/demo/general_train.txt"
BASE = ".cache/demo/general-chinese-bert"
REPLAY = [f"--data.replay.files=[{GENERAL}]", "--forgetting.budget={budget}"]
MERGE = ["--export.merge_budget={budget}"]
RUNS = {
    "none": [],
    "merge": MERGE,
    "replay": REPLAY,
    "replay + merge": REPLAY + MERGE,
}
_WALL = re.compile(r"mlm_adapt fit: (\d+) s wall")
_MERGE = re.compile(r"mlm_adapt merge: α=([\d.]+),.*?; (\d+) evaluations in ([\d.]+) s")
# A row of Lightning's validate table: │ name │ set 0 │ set 1 │ (one of the two cells empty).
_CELL = re.compile(r"│\s*(val(?:_general)?/perplexity)\s*│\s*([\d.]*)\s*│\s*([\d.]*)\s*│")


def command(*args: str) -> str:
    """Runs ``python -m mlm_adapt ARGS`` in the repository; its stdout and stderr."""
    line = [sys.executable, "-m", "mlm_adapt", *args]
    print("$", " ".join(line[1:]), flush=True)
    result = subprocess.run(line, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"failed:\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


def validate(model: str | Path, root: Path) -> dict[str, float]:
    """Domain and general perplexity of ``model`` by ``validate`` with the demo config."""
    output = command(
        "validate", "--config", "configs/demo.yaml", f"--model.model_name_or_path={model}",
        f"--trainer.default_root_dir={root}", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
        "--downstream.tasks=[]",
    )  # fmt: skip
    scores = {m.group(1): float(m.group(2) or m.group(3)) for m in _CELL.finditer(output)}
    return {"domain": scores["val/perplexity"], "general": scores["val_general/perplexity"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--budget", type=float, default=0.2, help="forgetting.budget and export.merge_budget."
    )
    parser.add_argument("--workdir", type=Path, default=REPO / "runs" / "merge_experiment")
    a = parser.parse_args()
    if not (REPO / GENERAL).is_file():
        sys.exit(f"{GENERAL} is missing: run python scripts/prepare_demo.py first")
    results = {}
    for name, extra in RUNS.items():
        root = a.workdir / name.replace(" + ", "_")
        output = command(
            "fit", "--config", "configs/demo.yaml", f"--trainer.default_root_dir={root}",
            f"--export.output_dir={root / 'export'}", "--trainer.enable_progress_bar=false",
            *(arg.format(budget=a.budget) for arg in extra),
        )  # fmt: skip
        merged = _MERGE.search(output)
        results[name] = {
            "wall": float(_WALL.search(output).group(1)),
            "alpha": float(merged.group(1)) if merged else 1.0,
            "evaluations": int(merged.group(2)) if merged else 0,
            "search": float(merged.group(3)) if merged else 0.0,
            **validate(root / "export", root / "validate"),
        }
    base = validate(BASE, a.workdir / "validate_base")
    print(f"\ndemo, budget {a.budget}; independent validate of each export; base {BASE}:")
    print(f"base: domain perplexity {base['domain']:,.2f}, general {base['general']:,.2f}")
    print(
        "| run | α | domain perplexity | general perplexity | general rise | domain reduction kept (vs the "
        "unmerged export) | search | fit wall (vs unmerged) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    twins = {"none": "none", "merge": "none", "replay": "replay", "replay + merge": "replay"}
    for name, r in results.items():
        unmerged = results[twins[name]]
        kept = (base["domain"] - r["domain"]) / (base["domain"] - unmerged["domain"])
        search = (
            f"{r['search']:.1f} s, {r['evaluations']} evaluations ({r['search'] / r['wall']:.1%} of the fit)"
            if r["evaluations"]
            else "-"
        )
        print(
            f"| {name} | {r['alpha']:.4g} | {r['domain']:,.2f} | {r['general']:,.2f} "
            f"| {r['general'] / base['general'] - 1:+.1%} | {kept:.1%} | {search} "
            f"| {r['wall']:.0f} s ({r['wall'] / unmerged['wall']:.2f}x) |"
        )


if __name__ == "__main__":
    main()
