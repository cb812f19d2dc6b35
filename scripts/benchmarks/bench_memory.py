"""Benchmark: peak memory of one training step with and without ``model.gradient_checkpointing``.

A bert-base-sized model (12 layers x 768, 12 heads, vocabulary 21128 like bert-base-chinese, random init,
built offline) trains one step through ``MaskedLMModule`` (masked-only head, SDPA) on a random batch. Each
setting runs in a fresh process; the peak resident set size of the step alone is measured on CPU (the peak
counter is reset after loading with ``/proc/self/clear_refs``), which counts activations, gradients and
optimizer-free temporaries the way GPU memory would, plus allocator slack. CPU peak RSS, not GPU memory.

    python scripts/benchmarks/bench_memory.py [--batch-size 4] [--seq-len 512]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _bench_common import machine  # noqa: E402

MODEL_DIR = Path(tempfile.gettempdir()) / "mlm_adapt_bench" / "bert-base-random"


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def build_model() -> Path:
    from transformers import BertConfig, BertForMaskedLM

    if not (MODEL_DIR / "config.json").exists():
        config = BertConfig(vocab_size=21128, hidden_size=768, num_hidden_layers=12, num_attention_heads=12)
        BertForMaskedLM(config).save_pretrained(MODEL_DIR)
    return MODEL_DIR


def child(checkpointing: bool, batch_size: int, seq_len: int) -> dict:
    import torch

    from mlm_adapt.model import MaskedLMModule

    torch.manual_seed(0)
    module = MaskedLMModule(str(MODEL_DIR), max_seq_length=seq_len, gradient_checkpointing=checkpointing)
    module.train()
    input_ids = torch.randint(1000, 21000, (batch_size, seq_len))
    labels = torch.where(torch.rand(batch_size, seq_len) < 0.15, input_ids, -100)
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM: the peak of the step alone from here
    before = _rss_kib("VmRSS")
    start = time.perf_counter()
    loss, _, _ = module.masked_lm_loss(batch)
    loss.backward()
    seconds = time.perf_counter() - start
    return {
        "peak_mib": _rss_kib("VmHWM") / 1024,
        "step_mib": (_rss_kib("VmHWM") - before) / 1024,
        "s": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--child", choices=["on", "off"])
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child == "on", args.batch_size, args.seq_len)))
        return
    build_model()
    print(f"# bench_memory: {machine()}")
    print(f"# bert-base-sized (12x768, vocab 21128), batch {args.batch_size} x {args.seq_len}, 1 step, CPU")
    results = {}
    for setting in ("off", "on"):
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                setting,
                "--batch-size",
                str(args.batch_size),
                "--seq-len",
                str(args.seq_len),
            ],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
        results[setting] = json.loads(out.strip().splitlines()[-1])
    print("| gradient_checkpointing | step peak RSS above the model (MiB) | process peak (MiB) | step s |")
    print("|---|---:|---:|---:|")
    for setting, r in results.items():
        print(f"| {setting} | {r['step_mib']:.0f} | {r['peak_mib']:.0f} | {r['s']:.1f} |")
    saved = 1 - results["on"]["step_mib"] / results["off"]["step_mib"]
    slower = results["on"]["s"] / results["off"]["s"]
    print(
        f"checkpointing saves {saved:.0%} of the step's memory, {slower:.2f}x the step time; "
        f"load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
