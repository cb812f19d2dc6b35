"""Benchmark: training throughput of mlm_adapt fit vs transformers' Trainer + DataCollatorForLanguageModeling.

Same small random BERT, same packed blocks of real reviews (from mlm_adapt's DataModule), same batch size,
optimizer (AdamW, lr 5e-5, wd 0.01), CPU, in-process DataLoader, alternating runs. mlm_adapt runs what
``python -m mlm_adapt fit`` builds (MaskedLMModule + MLMDataModule + Lightning Trainer, default options:
masked-only head, sdpa, whole-word masking, throughput logging); the baseline is the standard Trainer with the
token-level MLM collator (transformers' cheapest masking). Tokens/s = samples/s x mean block length (the
same blocks feed both). Goal: >= 1.0x.

    python scripts/bench_train.py [--steps 40] [--rounds 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from _bench_common import machine, quiet_trainer, reviews, table, tiny_model  # noqa: E402

BENCH_DIR = Path(tempfile.gettempdir()) / "mlm_adapt_bench"
WARMUP = 5


def run_mlm_adapt(model_dir: Path, dm, steps: int, batch_size: int) -> float:
    """Samples/s of the Lightning fit over ``steps`` steps after a warm-up."""
    import lightning as L

    from mlm_adapt.model import MaskedLMModule

    times: list[float] = []

    class Clock(L.Callback):
        def on_train_batch_end(self, *args, **kwargs) -> None:
            times.append(time.perf_counter())

    module = MaskedLMModule(str(model_dir), max_seq_length=128)
    trainer = quiet_trainer(accelerator="cpu", max_steps=WARMUP + steps, callbacks=[Clock()])
    trainer.fit(module, datamodule=dm)
    return steps * batch_size / (times[-1] - times[WARMUP - 1])


def run_hf(model_dir: Path, blocks, tokenizer, steps: int, batch_size: int) -> float:
    """Samples/s of transformers' Trainer + DataCollatorForLanguageModeling (token-level)."""
    from transformers import (
        AutoModelForMaskedLM,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *args, **kwargs) -> None:
            times.append(time.perf_counter())

    model = AutoModelForMaskedLM.from_pretrained(model_dir, attn_implementation="sdpa")
    args = TrainingArguments(
        output_dir=str(BENCH_DIR / "hf_out"),
        per_device_train_batch_size=batch_size,
        max_steps=WARMUP + steps,
        learning_rate=5e-5,
        weight_decay=0.01,
        warmup_steps=0,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=42,
    )
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, pad_to_multiple_of=8)
    trainer = Trainer(
        model=model, args=args, train_dataset=blocks, data_collator=collator, callbacks=[Clock()]
    )
    trainer.train()
    return steps * batch_size / (times[-1] - times[WARMUP - 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: least noise on shared CPUs)"
    )
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    import logging

    from lightning.pytorch.utilities import disable_possible_user_warnings

    disable_possible_user_warnings()
    for name in ("lightning.pytorch", "lightning.fabric", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)

    from mlm_adapt.data import MLMDataModule

    model_dir = tiny_model(
        BENCH_DIR / "train-bert",
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=512,
    )
    corpus = BENCH_DIR / "train_corpus" / "reviews.txt"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    corpus.write_text("\n".join(reviews()[:8000]) + "\n", encoding="utf-8")
    dm = MLMDataModule(
        train_files=[str(corpus)],
        tokenizer_name_or_path=str(model_dir),
        max_seq_length=128,
        packing=True,
        batch_size=args.batch_size,
        num_workers=0,
        cache_dir=str(BENCH_DIR / "hf_cache"),
    )
    dm.prepare_data()
    dm.setup("fit")
    blocks = dm.train_dataset.select_columns(["input_ids"])
    mean_len = dm.corpus_stats["train_tokens"] / dm.corpus_stats["train_examples"]

    samples: dict[str, list[float]] = {
        "mlm_adapt fit": [],
        "transformers Trainer + DataCollatorForLanguageModeling": [],
    }
    for _ in range(args.rounds):
        samples["mlm_adapt fit"].append(run_mlm_adapt(model_dir, dm, args.steps, args.batch_size))
        samples["transformers Trainer + DataCollatorForLanguageModeling"].append(
            run_hf(model_dir, blocks, dm.tokenizer, args.steps, args.batch_size)
        )
    base = statistics.median(samples["transformers Trainer + DataCollatorForLanguageModeling"])
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
    print(f"# bench_train: {machine()}, {args.threads} torch thread(s)")
    print(
        f"model: BERT h256 L4 A4 I1024, vocab {dm.tokenizer.vocab_size}; batch {args.batch_size}x128 packed "
        f"(mean {mean_len:.1f} tokens); {args.steps} timed steps after {WARMUP} warm-up, {args.rounds} rounds"
    )
    print(table(["trainer", "samples/s", "tokens/s (median)", "tokens/s per round", "ratio"], rows))


if __name__ == "__main__":
    main()
