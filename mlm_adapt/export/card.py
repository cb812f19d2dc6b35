"""The model card (``README.md`` of an export) and the facts about a run that it states."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import ModelCard, ModelCardData

from mlm_adapt.data.replay import parse_mix_rate
from mlm_adapt.export.options import DEFAULT_TAGS
from mlm_adapt.masking.collator import SCHEME_DESCRIPTIONS
from mlm_adapt.masking.schedule import parse_schedule
from mlm_adapt.model.metrics import before_after_names, validation_prefix

CONFIG_FILENAME = "training_config.yaml"


@dataclass
class ExportInfo:
    """What the model card says about the run (all optional: missing facts are left out of the card).

    ``model_hparams`` and ``data_hparams`` are the modules' hyper-parameters; ``baseline_metrics`` the
    validation metrics of the unadapted model (step 0), ``final_metrics`` those of the exported weights
    (at ``final_metrics_step``); ``config_yaml`` LightningCLI's resolved config; ``source`` which weights were
    exported (e.g. ``best checkpoint by val/loss: PATH``); ``repo_id`` the Hub repository of the usage
    example; ``replay`` what replay under ``data.forgetting_budget`` did
    (:func:`~mlm_adapt.data.replay.replay_summary`).
    """

    model_hparams: dict[str, Any] = field(default_factory=dict)
    data_hparams: dict[str, Any] = field(default_factory=dict)
    baseline_metrics: dict[str, float] = field(default_factory=dict)
    final_metrics: dict[str, float] = field(default_factory=dict)
    final_metrics_step: int | None = None
    corpus_stats: dict[str, int] = field(default_factory=dict)
    config_yaml: str | None = None
    source: str = ""
    global_step: int | None = None
    epoch: int | None = None
    license: str = "apache-2.0"
    tags: list[str] = field(default_factory=lambda: list(DEFAULT_TAGS))
    repo_id: str | None = None
    replay: dict[str, Any] = field(default_factory=dict)

    def resolved_config(self) -> str:
        """The YAML written next to the weights: LightningCLI's resolved config, else the hyperparameters."""
        if self.config_yaml:
            return self.config_yaml
        clean = {
            section: {k: v for k, v in hparams.items() if not k.startswith("_")}
            for section, hparams in (("model", self.model_hparams), ("data", self.data_hparams))
        }
        header = "# Hyperparameters stored in the checkpoint (no LightningCLI config recorded)\n"
        return header + yaml.safe_dump(clean, allow_unicode=True, sort_keys=False)


def val_metrics_at(
    history: dict[int, dict[str, float]], step: int | None
) -> tuple[dict[str, float], int | None]:
    """The validation metrics recorded at ``step`` or, failing that, the latest ones recorded before it."""
    steps = sorted(s for s in history if step is None or s <= step)
    return (dict(history[steps[-1]]), steps[-1]) if steps else ({}, None)


def _is_hub_id(name: str) -> bool:
    return not Path(name).exists() and name.count("/") == 1 and not name.startswith((".", "/"))


# Card rows whose string values are shown as they are (not formatted as numbers).
_VERBATIM = ("training data", "masking", "validation data", "mlm_probability", "general text replayed")


def _fmt(value: Any, digits: int | None = None) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.{digits}f}" if digits is not None else f"{value:g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(f"`{v}`" for v in value) or "none"
    return f"`{value}`" if value not in (None, "") else "none"


def _training_settings(info: ExportInfo) -> list[tuple[str, Any]]:
    config = yaml.safe_load(info.config_yaml) if info.config_yaml else {}
    trainer, model = config.get("trainer") or {}, config.get("model") or {}
    hp = info.model_hparams
    optimizer = model.get("optimizer")
    if isinstance(optimizer, dict):
        args = ", ".join(f"{k}={v}" for k, v in (optimizer.get("init_args") or {}).items())
        optimizer = f"{optimizer.get('class_path', '?').rsplit('.', 1)[-1]}({args})"
    return [  # rows without a value are left out by the caller
        ("exported weights", info.source or None),
        ("global step", info.global_step),
        ("epoch", info.epoch),
        ("optimizer", optimizer),
        ("learning-rate schedule", hp.get("lr_schedule")),
        ("warmup", hp.get("warmup")),
        ("batch size per device", info.data_hparams.get("batch_size")),
        ("max_steps", trainer.get("max_steps")),
        ("max_epochs", trainer.get("max_epochs")),
        ("precision", trainer.get("precision")),
        ("devices", trainer.get("devices")),
        ("strategy", trainer.get("strategy") if isinstance(trainer.get("strategy"), str) else None),
        ("accumulate_grad_batches", trainer.get("accumulate_grad_batches")),
    ]


def _replay_rows(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """The Corpus rows about general-text replay (``data.mix_files``), if the run replayed any."""
    if not data.get("mix_files"):
        return []
    budget = data.get("forgetting_budget")
    if budget is None:
        how = f" at mix rate {parse_mix_rate(data.get('mix_probability') or 0.0).describe()}"
    else:
        how = f", mix rate set by data.forgetting_budget={budget}"
    return [("general text replayed", _fmt(data["mix_files"]) + how)]


def _replay_lines(replay: dict[str, Any]) -> list[str]:
    """The Forgetting budget section: every rate change with the check that caused it, and the outcome."""
    if not replay:
        return []
    held = "held" if replay["held"] else "was exceeded"
    lines = [
        "",
        "## Forgetting budget",
        "",
        f"General-text replay was steered to keep the general validation perplexity within "
        f"+{replay['budget']:.0%} of step 0; at the last check it was {replay['last_rise']:+.1%}: the budget "
        f"{held}. Mean mix rate {replay['mean_rate']:.3f}, final {replay['final_rate']:g}.",
        "",
        "| step | general perplexity vs step 0 | mix rate from here |",
        "|---:|---:|---:|",
    ]
    return lines + [f"| {s} | {rise:+.1%} | {rate:g} |" for s, rate, rise in replay["trajectory"]]


def _validation_data(data: dict[str, Any]) -> str | None:
    """Which data each validation set is: files, or the held-out part of the training documents."""
    files, split = data.get("validation_files"), data.get("validation_split")
    held_out = f"{split:.1%} of the training documents, held out" if split is not None else None
    if not isinstance(files, dict):
        return _fmt(files) if files else held_out
    sets = [(validation_prefix(i, list(files)), name, value) for i, (name, value) in enumerate(files.items())]
    return "; ".join(f"`{p}/*`: {n} ({_fmt(v) if v else held_out or 'held out'})" for p, n, v in sets)


def render_model_card(info: ExportInfo, title: str) -> ModelCard:
    """The ``README.md`` model card: Hub metadata, before/after metrics, corpus, masking and training."""
    base = str(info.model_hparams.get("model_name_or_path", "unknown"))
    data = info.data_hparams
    rate = data.get("mlm_probability")  # a rate or a schedule's points
    metadata = ModelCardData(
        language="zh",
        license=info.license,
        library_name="transformers",
        pipeline_tag="fill-mask",
        tags=list(info.tags),
        base_model=base if _is_hub_id(base) else None,  # the Hub only accepts repository ids here
    )
    target = info.repo_id or title
    scheme, unit = SCHEME_DESCRIPTIONS.get(str(data.get("masking") or "whole_word"), ("masking", "unknown"))
    lines = [
        f"# {title}",
        "",
        f"`{base}` adapted to domain text by continued masked-language-model pretraining with {scheme} "
        "(mlm_adapt, PyTorch Lightning).",
        "",
        "## Usage",
        "",
        "```python",
        "from transformers import pipeline",
        "",
        f'fill_mask = pipeline("fill-mask", model="{target}")',
        'print(fill_mask("北京[MASK][MASK]你！"))',
        "```",
        "",
        "## Evaluation",
        "",
        "Masked-token metrics on the validation data, masked the same way as in training "
        "(loss: cross-entropy over masked tokens; perplexity: its exponential). `val/*` is the first "
        "validation set, `val_<name>/*` the others (see Corpus); `downstream/<task>/*` are labelled-task "
        "scores of the encoder (the `downstream:` section of the training configuration).",
        "",
    ]
    before, after = info.baseline_metrics, info.final_metrics
    if before or after:
        step = info.final_metrics_step
        after_head = f"after (step {step})" if step is not None else "after"
        lines += [f"| metric | before (step 0, `{base}`) | {after_head} |", "|---|---:|---:|"]
        for name in before_after_names(before, after):
            b, a = (_fmt(v[name], 4) if v.get(name) is not None else "n/a" for v in (before, after))
            lines.append(f"| {name} | {b} | {a} |")
    else:
        lines.append("No validation metrics were recorded for this checkpoint.")
    files = data.get("train_files") or ([data["dataset_name"]] if data.get("dataset_name") else [])
    if data.get("prepared_dir"):  # the run read only the directory, whatever train_files said
        files = f"the prepared directory `{data['prepared_dir']}` (`python -m mlm_adapt prepare`)"
    corpus = [("training data", files), *_replay_rows(data)]
    corpus += [("validation data", _validation_data(data))]
    corpus += [(k.replace("_", " "), v) for k, v in info.corpus_stats.items()]
    masking = [
        ("masking", f"{scheme} ({unit}); validation masks whole words whatever the training scheme"),
        ("segmenter", data.get("segmenter")),
        ("segmented through OpenCC", data.get("opencc")),  # Traditional text, Simplified segmentation
        ("jieba HMM", data.get("hmm")),
        ("user dictionary", data.get("user_dict")),
        ("mlm_probability", None if rate is None else parse_schedule(rate).describe()),
        ("eval_mlm_probability (validation masks)", data.get("eval_mlm_probability")),
        ("mask_replace_prob ([MASK])", data.get("mask_replace_prob")),
        ("random_replace_prob (random token)", data.get("random_replace_prob")),
        ("max_seq_length", data.get("max_seq_length", info.model_hparams.get("max_seq_length"))),
        ("packing", data.get("packing")),
    ]
    for heading, rows in (("Corpus", corpus), ("Masking", masking), ("Training", _training_settings(info))):
        shown = [(k, v) for k, v in rows if v is not None or k == "user dictionary"]
        lines += ["", f"## {heading}", ""] + [
            f"- {k}: {v if isinstance(v, str) and k in _VERBATIM else _fmt(v)}" for k, v in shown
        ]
    lines += _replay_lines(info.replay)
    lines += [
        "",
        f"The full resolved training configuration is in [`{CONFIG_FILENAME}`]({CONFIG_FILENAME}).",
        "",
    ]
    return ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n" + "\n".join(lines))
