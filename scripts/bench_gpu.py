"""GPU benchmark (prepared for a lent GPU, e.g. an H200): tokens/s and MFU of mlm_adapt training.

A bert-base-chinese-sized model (vocab 21128, hidden 768, 12 layers, 12 heads, FFN 3072), random init,
trained through the real stack (MaskedLMModule + whole-word collator + Lightning Trainer) in bf16-mixed
precision on packed blocks of seq 128 and 512 (synthetic Chinese-like token ids with jieba-style word ids,
so no download and no dataset package are needed). FLOPs per step are counted by
:func:`mlm_adapt.model.throughput.mlm_flops`; the peak is the datasheet dense bf16 figure that Lightning knows
for the device (``get_available_flops``) and, for comparison, a measured large bf16 matmul. MFU = achieved
model FLOPs/s / peak. Each configuration: warm-up steps, then timed steps (CUDA-synchronized). Finishes in
well under 5 minutes on an H100/H200. Goal: >= 45% MFU at seq 512 on an H200.

    python scripts/bench_gpu.py [--steps 30] [--compile] [--batch-128 256] [--batch-512 64]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _bench_common import quiet_trainer  # noqa: E402

WARMUP = 8


def build_model_dir(root: Path, smoke: bool = False) -> Path:
    """A bert-base-chinese-shaped random BertForMaskedLM + a char tokenizer, saved like a Hub checkpoint."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    out = root / ("smoke" if smoke else "bert-base-chinese-random")
    if (out / "config.json").exists():
        return out
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [chr(0x4E00 + i) for i in range(21128 - 5)]
    tokenizer = BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True)
    base = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    tiny = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    sizes = tiny if smoke else base
    config = BertConfig(vocab_size=21128, max_position_embeddings=512, pad_token_id=0, **sizes)
    BertForMaskedLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


class PackedBlocks(torch.utils.data.Dataset):
    """Full blocks ``[CLS] ... [SEP]`` of random ids with word ids of 1-4 tokens (like jieba on Chinese)."""

    def __init__(self, n: int, length: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.ids = rng.integers(5, 21128, size=(n, length), dtype=np.int64)
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
) -> dict:
    import lightning as L
    from transformers import AutoTokenizer

    from mlm_adapt.data.samplers import EpochSampler
    from mlm_adapt.masking import WholeWordMaskCollator
    from mlm_adapt.model import MaskedLMModule
    from mlm_adapt.model.throughput import mlm_flops

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    data = PackedBlocks(batch_size * (WARMUP + steps + 2), length)
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
        log_throughput=False,
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
        max_steps=WARMUP + steps,
        callbacks=[Clock()],
    )
    trainer.fit(module, train_dataloaders=loader)
    seconds = stamps[-1] - stamps[WARMUP - 1]
    achieved = sum(flops[WARMUP:]) / seconds
    return {
        "seq": length,
        "batch": batch_size,
        "compile": compile_model,
        "tokens_per_s": steps * batch_size * length / seconds,
        "model_tflops": achieved / 1e12,
        "step_ms": seconds / steps * 1000,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-128", type=int, default=256)
    parser.add_argument("--batch-512", type=int, default=64)
    parser.add_argument("--compile", action="store_true", help="also run with model.compile=true")
    parser.add_argument("--out", default=None, help="write the results as JSON here too")
    parser.add_argument(
        "--smoke", action="store_true", help="CPU, tiny model, 2 steps: checks the script only"
    )
    args = parser.parse_args()
    if args.smoke:
        model_dir = build_model_dir(Path(tempfile.gettempdir()) / "mlm_adapt_gpu_bench", smoke=True)
        print(run(model_dir, 128, 4, 2, compile_model=False, gpu=False))
        return
    if not torch.cuda.is_available():
        sys.exit("bench_gpu: no CUDA device; run this on a GPU machine")
    from lightning.fabric.utilities.throughput import get_available_flops

    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device("cuda")
    datasheet = get_available_flops(device, torch.bfloat16)
    measured = measured_bf16_peak()
    model_dir = build_model_dir(Path(tempfile.gettempdir()) / "mlm_adapt_gpu_bench")
    results = []
    for compile_model in (False, True) if args.compile else (False,):
        for length, batch in ((128, args.batch_128), (512, args.batch_512)):
            r = run(model_dir, length, batch, args.steps, compile_model)
            r["mfu_datasheet"] = r["model_tflops"] * 1e12 / datasheet if datasheet else None
            r["mfu_measured_peak"] = r["model_tflops"] * 1e12 / measured
            results.append(r)
    name = torch.cuda.get_device_name(0)
    print(
        f"# bench_gpu: {name}, datasheet bf16 peak {datasheet / 1e12 if datasheet else float('nan'):.0f} "
        f"TFLOP/s, measured 8192^3 bf16 matmul {measured / 1e12:.0f} TFLOP/s, torch {torch.__version__}"
    )
    print(
        "| seq | batch | compile | tokens/s | step ms | model TFLOP/s | MFU datasheet | MFU measured | GiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        mfu = f"{r['mfu_datasheet']:.1%}" if r["mfu_datasheet"] is not None else "n/a"
        print(
            f"| {r['seq']} | {r['batch']} | {r['compile']} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.0f} | "
            f"{r['model_tflops']:.0f} | {mfu} | {r['mfu_measured_peak']:.1%} | {r['peak_mem_gib']:.1f} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"device": name, "results": results}, indent=2))


if __name__ == "__main__":
    main()
