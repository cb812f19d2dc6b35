"""How fast each command answers ``--help`` and a typical refusal, against the interpreter's own start.

Per command: ``python -m mlm_adapt COMMAND --help`` and one refusal of a missing file (``--data.train_files``
for prepare, preview and vocab; the checkpoint, model, run directory or config for the others), each the
minimum of ``--runs`` fresh interpreters, measured in the same run as the baselines ``python -c pass`` and
``python -c "import lightning"``. The trainer commands' ``--help`` is timed twice: as first built (no help
cache: LightningCLI's parser) and as every later one answers (from mlm_adapt.cli.help_cache, kept in a
temporary directory warmed by the first round). Prints a Markdown table (docs/benchmarks.md).

    python scripts/benchmarks/bench_startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NO_CACHE = "<no help cache>"  # a marker in a case's arguments: run it with the help cache turned off


def cases(missing: Path) -> list[tuple[str, list[str]]]:
    """``(label, arguments of python)``: the baselines, then per command its --help and a refusal."""
    files = f"--data.train_files=[{missing / 'corpus.txt'}]"
    # Command -> (what is missing, its arguments).
    refusals = {
        "fit": ("--config", ["fit", "--config", str(missing / "fit.yaml")]),
        "validate": ("--config", ["validate", "--config", str(missing / "fit.yaml")]),
        "test": ("--config", ["test", "--config", str(missing / "fit.yaml")]),
        "prepare": ("--data.train_files", ["prepare", files, f"--data.prepared_dir={missing / 'prepared'}"]),
        "preview": ("--data.train_files", ["preview", files]),
        "export": (
            "--ckpt_path",
            ["export", "--ckpt_path", str(missing / "last.ckpt"), "--output_dir", "out"],
        ),
        "fill-mask": ("--model", ["fill-mask", "北京[MASK]你", "--model", str(missing / "model")]),
        "vocab": ("--data.train_files", ["vocab", files]),
        "plot": ("RUN_DIR", ["plot", str(missing / "run")]),
    }
    found = [("python -c pass", ["-c", "pass"]), ('python -c "import lightning"', ["-c", "import lightning"])]
    found.append(("python -m mlm_adapt (usage)", ["-m", "mlm_adapt"]))
    for command, (what, refusal) in refusals.items():
        if command in ("fit", "validate", "test"):
            found.append(
                (
                    f"{command} --help, first (builds the parser)",
                    ["-m", "mlm_adapt", command, "--help", NO_CACHE],
                )
            )
            found.append((f"{command} --help, later (cached)", ["-m", "mlm_adapt", command, "--help"]))
        else:
            found.append((f"{command} --help", ["-m", "mlm_adapt", command, "--help"]))
        found.append((f"{command}: missing {what}", ["-m", "mlm_adapt", *refusal]))
    return found


def timed(args: list[str], help_cache: Path) -> tuple[float, int]:
    """Wall seconds of one fresh interpreter running ``args``, and its exit status."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env["MLM_ADAPT_HELP_CACHE"] = "" if NO_CACHE in args else str(help_cache)
    args = [a for a in args if a != NO_CACHE]
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *args], capture_output=True, env=env, cwd=REPO, check=False)
    return time.perf_counter() - start, result.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh interpreters per case; the minimum counts")
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as tmp:
        all_cases = cases(Path(tmp) / "missing")
        best: dict[str, float] = {}
        codes: dict[str, int] = {}
        for _ in range(runs):  # interleaved rounds: a change of load hits every case alike
            for label, args in all_cases:
                seconds, codes[label] = timed(args, Path(tmp) / "help")
                best[label] = min(best.get(label, float("inf")), seconds)
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs, load {load:.1f}, min of {runs} runs\n")
    print("| case | seconds (min) | exit |\n|---|---:|---:|")
    for label, _ in all_cases:
        print(f"| `{label}` | {best[label]:.2f} | {codes[label]} |")


if __name__ == "__main__":
    main()
