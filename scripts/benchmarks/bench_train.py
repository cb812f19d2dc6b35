"""Benchmark: the ``mlm_adapt fit`` command vs transformers' Trainer + DataCollatorForLanguageModeling.

What users run, timed from the outside: every run is a fresh process (``python -m mlm_adapt fit`` with the
defaults, only the model, data, batch size and ``trainer.max_steps`` given; the baseline ``Trainer`` with its
defaults and transformers' recommended collator inputs, ``special_tokens_mask`` included), runs are
interleaved over rounds, and throughput counts the steps after a warm-up (a clock callback timestamps every
step; start-up, preprocessing, compilation and the first steps are excluded). Same small random BERT, same
packed blocks of real reviews, same batch size, AdamW lr 5e-5 wd 0.01, CPU. Variants of ``fit``:
``model.masked_only_head`` off, ``model.compile`` on, ``data.blocks.document_attention`` on.

    python scripts/benchmarks/bench_train.py [--steps 30] [--rounds 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _bench_common import machine, reviews, table, tiny_model  # noqa: E402

BENCH_DIR = Path(tempfile.gettempdir()) / "mlm_adapt_bench"
BENCHMARKS = Path(__file__).resolve().parent
REPO = BENCHMARKS.parents[1]
WARMUP = 5
FIT_VARIANTS = {
    "mlm_adapt fit (defaults)": [],
    "fit, model.masked_only_head=false": ["--model.masked_only_head=false"],
    "fit, model.compile=true": ["--model.compile=true"],
    "fit, data.blocks.document_attention=true": ["--data.blocks.document_attention=true"],
}
HF = "transformers Trainer + DataCollatorForLanguageModeling"


def run_fit(model_dir: Path, corpus: Path, extra: list[str], steps: int, batch_size: int, env: dict) -> float:
    """Samples/s of ``python -m mlm_adapt fit`` (a fresh process) over ``steps`` steps after the warm-up."""
    run_dir = Path(tempfile.mkdtemp(prefix="fit_run_", dir=BENCH_DIR))  # private: other runs share BENCH_DIR
    clock = run_dir / "clock.txt"
    command = [
        sys.executable,
        "-m",
        "mlm_adapt",
        "fit",
        f"--model.model_name_or_path={model_dir}",
        f"--data.train_files=[{corpus}]",
        "--model.max_seq_length=128",
        f"--data.batch_size={batch_size}",
        f"--data.cache_dir={BENCH_DIR / 'hf_cache'}",
        f"--trainer.max_steps={WARMUP + steps}",
        f"--trainer.default_root_dir={run_dir}",
        "--trainer.enable_progress_bar=false",
        "--trainer.callbacks+=_bench_clock.StepClock",
        f"--trainer.callbacks.path={clock}",
        "--export.checkpoint=none",
        *extra,
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=BENCH_DIR)
    if result.returncode != 0:
        raise RuntimeError(f"fit {extra} failed:\n{result.stderr[-3000:]}")
    times = [float(t) for t in clock.read_text().split()]
    shutil.rmtree(run_dir, ignore_errors=True)
    return steps * batch_size / (times[-1] - times[WARMUP - 1])


def run_hf(model_dir: Path, steps: int, batch_size: int) -> float:
    """Samples/s of transformers' Trainer + DataCollatorForLanguageModeling (token-level), in this process."""
    import time

    import datasets
    from transformers import (
        AutoModelForMaskedLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *args, **kwargs) -> None:
            times.append(time.perf_counter())

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    blocks = datasets.load_from_disk(str(BENCH_DIR / "hf_blocks"))
    model = AutoModelForMaskedLM.from_pretrained(model_dir)
    args = TrainingArguments(
        output_dir=str(BENCH_DIR / "hf_out"),
        per_device_train_batch_size=batch_size,
        max_steps=WARMUP + steps,
        learning_rate=5e-5,
        weight_decay=0.01,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=42,
    )
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    trainer = Trainer(
        model=model, args=args, train_dataset=blocks, data_collator=collator, callbacks=[Clock()]
    )
    trainer.train()
    return steps * batch_size / (times[-1] - times[WARMUP - 1])


def prepare_hf_blocks(dm) -> None:
    """The fit's packed training blocks with ``special_tokens_mask`` (transformers' recommended input)."""
    special = {dm.tokenizer.cls_token_id, dm.tokenizer.sep_token_id}

    def with_mask(batch: dict) -> dict:
        return {"special_tokens_mask": [[int(t in special) for t in ids] for ids in batch["input_ids"]]}

    blocks = dm.train_dataset.select_columns(["input_ids"]).map(with_mask, batched=True)
    blocks.save_to_disk(str(BENCH_DIR / "hf_blocks"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every run (1: least noise)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--only", nargs="*", help="variants to run (default: all)")
    parser.add_argument("--hf-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    model_dir = tiny_model(
        BENCH_DIR / "train-bert",
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=512,
    )
    if args.hf_child:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(run_hf(model_dir, args.steps, args.batch_size)))
        return

    from mlm_adapt.data import MLMDataModule

    corpus = BENCH_DIR / "train_corpus" / "reviews.txt"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    corpus.write_text("\n".join(reviews()[:8000]) + "\n", encoding="utf-8")
    dm = MLMDataModule(
        train_files=[str(corpus)],
        tokenizer_name_or_path=str(model_dir),
        max_seq_length=128,
        batch_size=args.batch_size,
        cache_dir=str(BENCH_DIR / "hf_cache"),
    )
    dm.prepare_data()
    dm.setup("fit")
    prepare_hf_blocks(dm)
    mean_len = dm.corpus_stats["train_tokens"] / dm.corpus_stats["train_examples"]
    threads = str(args.threads)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(BENCHMARKS), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PYTHONWARNINGS": "ignore",
    }
    variants = [v for v in [*FIT_VARIANTS, HF] if not args.only or any(o in v for o in args.only)]
    samples: dict[str, list[float]] = {name: [] for name in variants}
    loads = []
    for _ in range(args.rounds):
        for name in variants:
            loads.append(os.getloadavg()[0])
            if name == HF:
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--hf-child",
                        f"--steps={args.steps}",
                        f"--batch-size={args.batch_size}",
                        f"--threads={args.threads}",
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                samples[name].append(float(out.strip().splitlines()[-1]))
            else:
                samples[name].append(
                    run_fit(model_dir, corpus, FIT_VARIANTS[name], args.steps, args.batch_size, env)
                )
            print(
                f"  {name}: {samples[name][-1] * mean_len:,.0f} tokens/s (load {loads[-1]:.1f})", flush=True
            )
    base = statistics.median(samples[HF]) if HF in samples else float("nan")
    rows = [
        [
            name,
            f"{statistics.median(v):.1f}",
            f"{statistics.median(v) * mean_len:,.0f}",
            " / ".join(f"{x * mean_len:,.0f}" for x in v),
            f"{statistics.median(v) / base:.2f}x",
        ]
        for name, v in samples.items()
    ]
    print(
        f"# bench_train: {machine()}, {args.threads} torch thread(s), load during runs "
        f"{min(loads):.1f}-{max(loads):.1f}"
    )
    print(
        f"model: BERT h256 L4 A4 I1024, vocab {dm.tokenizer.vocab_size}; batch {args.batch_size}x128 packed "
        f"(mean {mean_len:.1f} tokens); {args.steps} timed steps after {WARMUP} warm-up, "
        f"{args.rounds} rounds, fresh process per run"
    )
    print(table(["run", "samples/s", "tokens/s (median)", "tokens/s per round", f"vs {HF}"], rows))


if __name__ == "__main__":
    main()
