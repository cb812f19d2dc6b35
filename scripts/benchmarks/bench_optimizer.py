"""Benchmark: one AdamW step at real model size: torch's for-loop, foreach and fused (mlm_adapt's) kernels.

The parameters are those of a randomly initialized ``BertForMaskedLM`` of ``bert-base-chinese``'s shape
(21,128 tokens, 12 x 768; ~102 M parameters) in mlm_adapt's two groups (weight decay on matrices only),
with random gradients. Each implementation is timed in alternating rounds (median seconds per step); the
ratio is against the for-loop, which is what torch picks on CPU when neither ``fused`` nor ``foreach`` is set.

    python scripts/benchmarks/bench_optimizer.py [--rounds 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _bench_common import machine, table  # noqa: E402

from mlm_adapt.model.module import fastest_kernels  # noqa: E402


def bert_base_parameters(device: str) -> list[torch.nn.Parameter]:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=21_128, hidden_size=768, num_hidden_layers=12, intermediate_size=3072)
    model = BertForMaskedLM(config).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    return params


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    params = bert_base_parameters(args.device)
    groups = lambda: [  # noqa: E731
        {"params": [p for p in params if p.ndim >= 2]},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    adamw = functools.partial(torch.optim.AdamW, lr=5e-5, weight_decay=0.01)
    optimizers = {
        "for-loop (torch's CPU default)": adamw(groups(), foreach=False),
        "foreach": adamw(groups(), foreach=True),
        "fused (mlm_adapt's default)": fastest_kernels(adamw(groups())),
    }
    samples: dict[str, list[float]] = {name: [] for name in optimizers}
    for optimizer in optimizers.values():
        optimizer.step()  # warm-up: allocates the moments
    for _ in range(args.rounds):
        for name, optimizer in optimizers.items():
            start = time.perf_counter()
            optimizer.step()
            if args.device == "cuda":
                torch.cuda.synchronize()
            samples[name].append(time.perf_counter() - start)
    base = sorted(samples["for-loop (torch's CPU default)"])[args.rounds // 2]
    rows = []
    for name, times in samples.items():
        median = sorted(times)[args.rounds // 2]
        rows.append([name, f"{median:.3f}", f"{base / median:.2f}x"])
    print(f"# {machine()}; {sum(p.numel() for p in params) / 1e6:.0f} M parameters on {args.device}\n")
    print(table(["AdamW implementation", "s per step (median)", "speed-up vs for-loop"], rows))


if __name__ == "__main__":
    main()
