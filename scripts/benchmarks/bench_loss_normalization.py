"""Benchmark: the cost of normalizing the loss by the optimizer step's masked-token count across micro-batches
and ranks (mlm_adapt's training step) against the per-micro-batch mean (the baseline), on 2 DDP ranks.

The step-normalized loss adds one all-reduce of the first micro-batch's masked count before its loss and one
of ``[summed loss, count]`` before the optimizer step (and a gradient rescale under accumulation). Both
variants train the same tiny BERT (4 layers, hidden 256) on the same synthetic masked batches (batch 8 per
rank, 128 tokens, accumulation 2) for ``--steps`` steps on 2 CPU processes (gloo), in alternating rounds;
the figure is the median ms per optimizer step after 3 warm-up steps.

    python scripts/benchmarks/bench_loss_normalization.py [--rounds 3] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from _bench_common import machine, quiet_trainer, reviews, table  # noqa: E402

from mlm_adapt.model import MaskedLMModule  # noqa: E402

SEQ, BATCH, ACCUMULATION, WARMUP = 128, 8, 2, 3


class MaskedBatches(torch.utils.data.Dataset):
    """Random ids with 5-25% of the real tokens masked: masked counts differ between rows."""

    def __init__(self, n: int, vocab_size: int):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, vocab_size, (n, SEQ), generator=generator)
        self.lengths = torch.randint(SEQ // 2, SEQ + 1, (n,), generator=generator)
        self.rates = torch.rand(n, generator=generator) * 0.2 + 0.05

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        attention = (torch.arange(SEQ) < self.lengths[i]).long()
        chosen = (
            torch.rand(SEQ, generator=torch.Generator().manual_seed(i)) < self.rates[i]
        ) & attention.bool()
        return {
            "input_ids": torch.where(chosen, 4, self.ids[i]),
            "attention_mask": attention,
            "labels": torch.where(chosen, self.ids[i], -100),
        }


class PerMicroBatchMean(MaskedLMModule):
    """The baseline: each micro-batch's own mean, averaged by accumulation and DDP."""

    def training_step(self, batch, batch_idx):
        return self.masked_lm_loss(batch)[0]

    def on_before_optimizer_step(self, optimizer) -> None:
        pass


class StepClock(L.Callback):
    def __init__(self, out_file: str):
        self.out_file, self.stamps = out_file, []

    def on_before_zero_grad(self, trainer, pl_module, optimizer) -> None:
        self.stamps.append(time.perf_counter())

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.global_rank == 0:
            Path(self.out_file).write_text(json.dumps(self.stamps))


def run(variant: str, model_dir: Path, steps: int, out_file: Path) -> float:
    module_class = PerMicroBatchMean if variant == "baseline" else MaskedLMModule
    module = module_class(str(model_dir), max_seq_length=SEQ, warmup=0)
    data = MaskedBatches(BATCH * 2 * ACCUMULATION * (steps + WARMUP + 1), module.model.config.vocab_size)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    trainer = quiet_trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_steps=steps + WARMUP,
        accumulate_grad_batches=ACCUMULATION,
        callbacks=[StepClock(str(out_file))],
    )
    trainer.fit(module, train_dataloaders=loader)
    stamps = json.loads(out_file.read_text())[WARMUP:]
    return statistics.median(b - a for a, b in zip(stamps, stamps[1:], strict=False)) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    from mlm_adapt.model.tiny import build_tiny_bert

    root = Path(tempfile.mkdtemp(prefix="bench_loss_norm_"))
    model_dir = build_tiny_bert(
        root / "model",
        reviews()[:5000],
        max_chars=3000,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=SEQ,
    )
    samples: dict[str, list[float]] = {"baseline": [], "normalized": []}
    for _ in range(args.rounds):
        for variant in samples:
            samples[variant].append(run(variant, model_dir, args.steps, root / f"{variant}.json"))
    baseline = statistics.median(samples["baseline"])
    rows = [
        ["per-micro-batch mean (baseline)", f"{baseline:.1f}", "1.00x"],
        [
            "step's masked count across micro-batches and ranks (mlm_adapt)",
            f"{statistics.median(samples['normalized']):.1f}",
            f"{statistics.median(samples['normalized']) / baseline:.2f}x",
        ],
    ]
    print(f"# {machine()}; 2 DDP ranks (gloo), batch {BATCH} x {SEQ} tokens, accumulation {ACCUMULATION}")
    print(table(["loss", "ms per optimizer step", "vs baseline"], rows))


if __name__ == "__main__":
    main()
