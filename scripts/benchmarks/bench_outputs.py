"""What the output guard costs per checkpoint save: ``AtomicCheckpointIO`` (guard.outputs.write_file: checks,
marked staging directory, fsync, rename, umask) against a bare ``torch.save`` to the same directory.

    python scripts/benchmarks/bench_outputs.py [--sizes_mb 1 64] [--repeats 10]

Prints a table (median seconds per save) and the ratio guarded / bare, with the load average: on a shared
machine the ratio is the figure to read, not the absolute times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from mlm_adapt.training.checkpoint_files import AtomicCheckpointIO


def _median_seconds(saves: list, repeats: int) -> list[float]:
    """Median seconds of each save, run interleaved (after one warm-up each) so load drifts hit all alike."""
    for save in saves:
        save()
    times: list[list[float]] = [[] for _ in saves]
    for _ in range(repeats):
        for save, spent in zip(saves, times, strict=True):
            start = time.perf_counter()
            save()
            spent.append(time.perf_counter() - start)
    return [statistics.median(spent) for spent in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes_mb", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average (1/5/15 min): {load}; {os.cpu_count()} CPUs")
    print(f"{'checkpoint':>10} {'bare torch.save':>16} {'guarded save':>13} {'ratio':>6}")
    io = AtomicCheckpointIO()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for size in args.sizes_mb:
            checkpoint = {"state_dict": {"w": torch.zeros(size * 2**20 // 4)}, "global_step": 1}

            def bare(checkpoint=checkpoint) -> None:
                with open(directory / "bare.ckpt", "wb") as handle:
                    torch.save(checkpoint, handle)
                    handle.flush()
                    os.fsync(handle.fileno())  # the guarded save fsyncs too: compare like with like

            def guarded(checkpoint=checkpoint) -> None:
                io.save_checkpoint(checkpoint, directory / "last.ckpt")

            bare_s, guarded_s = _median_seconds([bare, guarded], args.repeats)
            print(f"{size:>8}MB {bare_s:>15.4f}s {guarded_s:>12.4f}s {guarded_s / bare_s:>6.2f}")


if __name__ == "__main__":
    main()
