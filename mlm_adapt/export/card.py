"""The model card (``README.md`` of an export) and the facts about a run that it states."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import ModelCard, ModelCardData

from mlm_adapt.data.forgetting import ForgettingOptions
from mlm_adapt.data.replay import ReplayOptions, segment_columns
from mlm_adapt.export.merge import CURVE_FILENAME
from mlm_adapt.guard.secrets import WITHHELD, withhold
from mlm_adapt.masking.collator import SCHEME_DESCRIPTIONS
from mlm_adapt.masking.options import MaskingOptions
from mlm_adapt.model.loading import HEAD_PARTIAL, HEAD_UNTRAINED
from mlm_adapt.model.metrics import before_after_names, validation_prefix
from mlm_adapt.options import as_options
from mlm_adapt.text.blocks import BlockOptions
from mlm_adapt.text.segmentation import SegmentationOptions

CONFIG_FILENAME = "training_config.yaml"
# The Hub tags every export gets; the model family's and the masking scheme's are added (run_tags).
COMMON_TAGS = ("fill-mask", "chinese", "domain-adaptation", "mlm_adapt")
SCHEME_TAGS = {"whole_word": ("whole-word-masking",), "ngram": ("whole-word-masking", "ngram-masking")}
JIEBA_SEGMENTERS = ("rjieba", "jieba")


@dataclass
class ExportInfo:
    """What the model card says about the run (all optional: missing facts are left out of the card).

    ``model_hparams`` and ``data_hparams`` are the modules' hyper-parameters (the run's resolved settings:
    every sentence of the card about masking, segmentation and replay follows from them);
    ``baseline_metrics`` the validation metrics of the unadapted model (step 0), ``final_metrics`` those of
    the exported weights (at ``final_metrics_step``); ``config_yaml`` LightningCLI's resolved config;
    ``source`` which weights were exported (e.g. ``best checkpoint by val/loss: last.ckpt (step 6)``);
    ``repo_id`` and ``revision`` the Hub repository and branch of the usage example; ``replay`` what replay
    under ``forgetting.budget`` did (:func:`~mlm_adapt.data.replay.replay_summary`); ``tags`` the Hub tags
    given (``None``: :func:`run_tags`); ``model_type`` and ``mask_token`` those of the exported model and
    tokenizer (the family's tag, the usage example's mask); ``head`` what the base checkpoint's masked-LM
    head was (:func:`~mlm_adapt.model.loading.check_head`; ``None``: a random init); ``merge`` how the
    exported weights were merged back toward the base (:meth:`~mlm_adapt.export.merge.MergeReport.plain`;
    empty: not merged).
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
    tags: list[str] | None = None
    repo_id: str | None = None
    revision: str | None = None
    replay: dict[str, Any] = field(default_factory=dict)
    model_type: str | None = None
    mask_token: str = "[MASK]"
    head: str | None = None
    merge: dict[str, Any] = field(default_factory=dict)

    def resolved_config(self) -> str:
        """The YAML written next to the weights: LightningCLI's resolved config, else the hyperparameters;
        secret init arguments withheld (:mod:`mlm_adapt.guard.secrets`)."""
        if self.config_yaml:
            config = yaml.safe_load(self.config_yaml)
            withheld = withhold(config)
            if withheld == config:
                return self.config_yaml
            header = f"# Secret init arguments are withheld ({WITHHELD})\n"
            return header + yaml.safe_dump(withheld, allow_unicode=True, sort_keys=False)
        clean = {
            section: {k: v for k, v in hparams.items() if not k.startswith("_")}
            for section, hparams in (("model", self.model_hparams), ("data", self.data_hparams))
        }
        header = "# Hyperparameters stored in the checkpoint (no LightningCLI config recorded)\n"
        return header + yaml.safe_dump(withhold(clean), allow_unicode=True, sort_keys=False)


def checkpoint_name(path: str | Path, step: int | None) -> str:
    """A checkpoint as a card names it: its file (or sharded directory) name and step, no path of the
    machine that trained."""
    return f"{Path(path).name} (step {step})" if step is not None else Path(path).name


def val_metrics_at(
    history: dict[int, dict[str, float]], step: int | None
) -> tuple[dict[str, float], int | None]:
    """The validation metrics recorded at ``step`` or, failing that, the latest ones recorded before it."""
    steps = sorted(s for s in history if step is None or s <= step)
    return (dict(history[steps[-1]]), steps[-1]) if steps else ({}, None)


def _masking(data: dict[str, Any]) -> MaskingOptions:
    return as_options(MaskingOptions, data.get("masking"), "data.masking")


def _segmentation(data: dict[str, Any]) -> SegmentationOptions:
    return as_options(SegmentationOptions, data.get("segmentation"), "data.segmentation")


def masking_scheme(data: dict[str, Any]) -> str:
    """The run's training masking scheme (``data.masking.scheme``; ``whole_word`` when not recorded)."""
    return _masking(data).scheme


def run_tags(info: ExportInfo) -> list[str]:
    """The Hub tags: those given (``export.tags``), else the model family, :data:`COMMON_TAGS` and the
    masking scheme's (no ``whole-word-masking`` on a token-masking run)."""
    if info.tags is not None:
        return list(info.tags)
    family = [info.model_type] if info.model_type else []
    return [*family, *COMMON_TAGS, *SCHEME_TAGS.get(masking_scheme(info.data_hparams), ())]


def _segmenter(value: Any) -> str | None:
    """``data.segmentation.segmenter`` for the card: a name, or a class path with its init args, secrets
    withheld."""
    if isinstance(value, dict) and "class_path" in value:
        init_args = withhold(value).get("init_args") or {}
        args = ", ".join(f"{k}={v if v == WITHHELD else repr(v)}" for k, v in init_args.items())
        said = " (secret arguments withheld)" if WITHHELD in init_args.values() else ""
        return f"`{value['class_path']}({args})`{said}"
    return None if value is None else f"`{value}`"


def _user_dict(segmentation: SegmentationOptions) -> str:
    return f"`{shown_path(segmentation.user_dict)}`" if segmentation.user_dict else "none"


def _evaluation_masks(data: dict[str, Any]) -> str:
    """How validation is masked, said against how training was: the same only when it is."""
    masking = _masking(data)
    train_rate, evaluation = masking.schedule, masking.eval_mlm_probability
    same_rate = train_rate.constant and train_rate.initial_rate == evaluation
    rate = f" at rate {evaluation:g}"
    if masking.scheme == "whole_word" and same_rate:
        return f"Validation masks whole words{rate}, as training did."
    name = SCHEME_DESCRIPTIONS.get(masking.scheme, (masking.scheme, ""))[0]
    training = f"{name} at {train_rate.describe()}"
    return f"Validation masks whole words{rate} whatever the training, which used {training}."


def _is_hub_id(name: str) -> bool:
    return not Path(name).exists() and name.count("/") == 1 and not name.startswith((".", "/"))


def shown_path(name: Any) -> Any:
    """A file, directory or pattern (or a list of them) as a card names it: a Hub id as it is, a local path
    by its last part (a pattern with its directory's name), never a path of the machine that trained."""
    if isinstance(name, (list, tuple)):
        return [shown_path(n) for n in name]
    if not isinstance(name, str) or not name or _is_hub_id(name):
        return name
    path = Path(name)
    pattern = any(c in path.name for c in "*?[") and path.parent.name
    return f"{path.parent.name}/{path.name}" if pattern else path.name or name


# Card rows whose string values are shown as they are (not formatted as numbers).
_VERBATIM = (
    "training data",
    "masking",
    "validation data",
    "mlm_probability",
    "general text replayed",
    "segmenter",
    "user dictionary",
)


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


def _replay_rows(data: dict[str, Any], replay: dict[str, Any]) -> list[tuple[str, Any]]:
    """The Corpus rows about general-text replay (``data.replay.files``), if the run replayed any."""
    options = as_options(ReplayOptions, data.get("replay"), "data.replay")
    if not options.files:
        return []
    budget = as_options(ForgettingOptions, data.get("forgetting"), "forgetting").budget
    if budget is None:
        how = f" at replay rate {options.schedule.describe()}"
    else:
        how = f", replay rate set by forgetting.budget={budget}"
    if "segments" in replay:
        how += " (the run's last segment: see Replay settings by segment)"
    return [("general text replayed", _fmt(shown_path(options.files)) + how)]


def _budget_lines(replay: dict[str, Any]) -> list[str]:
    """The Forgetting budget section: the verdict from the checks that ran (or 'not measured' when none ran
    after the baseline), and every rate change with the check that caused it."""
    budget, base, final = replay["budget"], replay["baseline_step"], replay["final_rate"]
    lines = ["", "## Forgetting budget", ""]
    later = replay.get("later_checks")
    if later:  # the exported weights are an earlier step's than the run's last checks
        lines += [
            f"These are the checks up to the exported weights' step; the run's {later} later check(s) "
            "measured later weights and are left out.",
            "",
        ]
    if replay["held"] is None:
        why = (
            "the exported weights come before the first check"
            if later
            else "forgetting.check_interval was longer than the steps that followed"
        )
        return lines + [
            f"General-text replay was to keep the general validation perplexity within +{budget:.0%} of step "
            f"{base}, but no check ran after the baseline at step {base} ({why}): forgetting was not "
            f"measured, and the budget is neither held nor exceeded. Replay rate {final:g}."
        ]
    held = "held" if replay["held"] else "was exceeded"
    lines += [
        f"General-text replay was steered to keep the general validation perplexity within +{budget:.0%} of "
        f"step {base}; {replay['checks']} check(s) ran after step {base}, the last at step "
        f"{replay['last_check']}, where it was {replay['last_rise']:+.1%}: the budget {held}. "
        f"Mean replay rate {replay['mean_rate']:.3f}, final {final:g}.",
        "",
        f"| step | general perplexity vs step {base} | replay rate from here |",
        "|---:|---:|---:|",
    ]
    return lines + [f"| {s} | {rise:+.1%} | {rate:g} |" for s, rate, rise in replay["trajectory"]]


def _merge_lines(merge: dict[str, Any], base: str) -> list[str]:
    """The Merged toward the base section: α, how it was chosen, what the exported weights score against the
    base and the unmerged adaptation, and the α curve of the search."""
    alpha, budget = merge["alpha"], merge.get("budget")
    general = merge.get("general_prefix")
    lines = [
        "",
        "## Merged toward the base",
        "",
        f"The exported weights are `{base}` + α·(adapted − `{base}`) with **α = {alpha:.4g}** (1: the "
        "adapted model, 0: the base), every weight interpolated; the rows of added tokens and a head the "
        "base lacked keep their adapted values.",
    ]
    if budget is None:
        lines[-1] += " α was given (`export.merge_alpha`)."
    else:
        lines[-1] += (
            f" α is the largest whose `{general}/perplexity` rose at most {budget:.0%} over the base's "
            "(`export.merge_budget`) with 95% confidence (the rise plus 1.645 standard errors of the mean "
            "paired loss difference per masked token) on half of that set's validation blocks (even "
            "positions); the figures below are of the other half, which the choice did not see."
        )
    figures = merge.get("figures") or {}
    if not figures:
        return lines + [
            "",
            "The merged weights were not scored here (`python -m mlm_adapt validate` scores them).",
        ]
    names = list(figures["base"])
    lines += ["", "| perplexity | base | adapted | exported (merged) |", "|---|---:|---:|---:|"]
    for name in names:
        held = " (held-out half)" if budget is not None and name.startswith(f"{general}/") else ""
        cells = " | ".join(_fmt(figures[w][name], 2) for w in ("base", "adapted", "merged"))
        lines.append(f"| {name}{held} | {cells} |")
    if merge.get("curve"):
        lines += [
            "",
            f"Every α the search scored (`{general}` on the selection half; the domain where it was scored), "
            f"drawn in [`{CURVE_FILENAME}`]({CURVE_FILENAME}):",
            "",
            f"| α | {names[0]} | {general}/perplexity |",
            "|---:|---:|---:|",
        ]
        lines += [f"| {a:g} | {'' if d is None else f'{d:.2f}'} | {g:.2f} |" for a, d, g in merge["curve"]]
    return lines


def _segment_lines(segments: list[list[Any]]) -> list[str]:
    """The Replay settings by segment section: the budget (and every other replay setting that changed)
    of each stretch of a run resumed with changed replay settings."""
    names = segment_columns(segments)
    lines = [
        "",
        "## Replay settings by segment",
        "",
        "The run was resumed with changed replay settings; each check is judged against the budget in force "
        "when it ran.",
        "",
        "| from step | " + " | ".join(names) + " |",
        "|---:|" + "---|" * len(names),
    ]
    for first, settings in segments:
        lines.append(f"| {first} | " + " | ".join(_fmt(settings.get(n)) for n in names) + " |")
    return lines


def _replay_lines(replay: dict[str, Any]) -> list[str]:
    """The sections about what replay did: the forgetting budget's, and the settings of each segment."""
    lines = _budget_lines(replay) if "budget" in replay else []
    return lines + (_segment_lines(replay["segments"]) if "segments" in replay else [])


def _validation_data(data: dict[str, Any]) -> str | None:
    """Which data each validation set is: files, or the held-out part of the training documents."""
    files, split = data.get("validation_files"), data.get("validation_split")
    held_out = f"{split:.1%} of the training documents, held out" if split is not None else None
    if not isinstance(files, dict):
        return _fmt(shown_path(files)) if files else held_out
    sets = [(validation_prefix(i, list(files)), name, value) for i, (name, value) in enumerate(files.items())]
    return "; ".join(
        f"`{p}/*`: {n} ({_fmt(shown_path(v)) if v else held_out or 'held out'})" for p, n, v in sets
    )


def render_model_card(info: ExportInfo, title: str) -> ModelCard:
    """The ``README.md`` model card: Hub metadata, before/after metrics, corpus, masking and training."""
    name = str(info.model_hparams.get("model_name_or_path", "unknown"))
    base = shown_path(name)
    # model.pretrained false: the base's architecture and tokenizer, none of its weights.
    from_scratch = info.model_hparams.get("pretrained") is False
    data = info.data_hparams
    metadata = ModelCardData(
        language="zh",
        license=info.license,
        library_name="transformers",
        pipeline_tag="fill-mask",
        tags=run_tags(info),
        # The Hub only accepts repository ids here, and a random init is no fine-tune of the base's weights.
        base_model=name if _is_hub_id(name) and not from_scratch else None,
    )
    target = info.repo_id or title
    # A branch's card loads that branch: without revision= the pipeline would load main.
    revision = f', revision="{info.revision}"' if info.repo_id and info.revision not in (None, "main") else ""
    scheme, unit = SCHEME_DESCRIPTIONS.get(masking_scheme(data), ("masking", "unknown"))
    before, after = info.baseline_metrics, info.final_metrics
    names = set(before) | set(after)
    sets = "`val/*` is the validation set"
    if any(n.startswith("val_") for n in names) or isinstance(data.get("validation_files"), dict):
        sets = "`val/*` is the first validation set, `val_<name>/*` the others (see Corpus)"
    if any(n.startswith("downstream/") for n in names):
        sets += (
            "; `downstream/<task>/*` are labelled-task scores of the encoder (the `downstream:` section of "
            "the training configuration)"
        )
    if from_scratch:
        summary = (
            f"A masked language model of `{base}`'s architecture and tokenizer, randomly initialized (none "
            f"of its weights) and pretrained from scratch on domain text with {scheme} (mlm_adapt, PyTorch "
            "Lightning)."
        )
    else:
        summary = (
            f"`{base}` adapted to domain text by continued masked-language-model pretraining with {scheme} "
            "(mlm_adapt, PyTorch Lightning)"
        )
        if info.merge:
            summary += f", then merged back toward it (α = {info.merge['alpha']:.4g}: see below)"
        summary += "."
    if revision:
        step = f": the weights of step {info.global_step}" if info.global_step is not None else ""
        summary += f"\n\nThis is the `{info.revision}` branch of `{info.repo_id}`{step}."
    lines = [
        f"# {title}",
        "",
        summary,
        "",
        "## Usage",
        "",
        "```python",
        "from transformers import pipeline",
        "",
        f'fill_mask = pipeline("fill-mask", model="{target}"{revision})',
        f'print(fill_mask("北京{info.mask_token}你！"))',
        "```",
        "",
        "## Evaluation",
        "",
        "Masked-token metrics on the validation data (loss: cross-entropy over masked tokens; perplexity: "
        f"its exponential). {_evaluation_masks(data)} {sets}.",
        "",
    ]
    warmup = info.model_hparams.get("head_warmup_steps") or 0
    if before or after:
        step = info.final_metrics_step
        after_head = f"after (step {step})" if step is not None else "after"
        before_head = f"step {warmup}, after a head warm-up" if warmup else "step 0"
        before_head += ", random init" if from_scratch else f", `{base}`"
        merged = (info.merge or {}).get("merged_metrics") or {}
        merged_head = f" merged, α = {info.merge['alpha']:.4g} (exported) |" if merged else ""
        lines += [
            f"| metric | before ({before_head}) | {after_head} |{merged_head}",
            "|---|---:|---:|" + ("---:|" if merged else ""),
        ]
        for name in before_after_names(before, after):
            b, a = (_fmt(v[name], 4) if v.get(name) is not None else "n/a" for v in (before, after))
            m = f" {_fmt(merged[name], 4) if name in merged else 'not scored'} |" if merged else ""
            lines.append(f"| {name} | {b} | {a} |{m}")
    else:
        lines.append("No validation metrics were recorded for this checkpoint.")
    if info.head in (HEAD_UNTRAINED, HEAD_PARTIAL):
        what = "had no masked-LM head (an encoder-only checkpoint)"
        if info.head == HEAD_PARTIAL:
            what = "held only part of its masked-LM head"
        scored = "so the before column scores it, not the encoder"
        if warmup:
            scored = f"and trained alone for {warmup} steps before the before column was scored"
        lines += ["", f"`{base}` {what}: the head started untrained, {scored}."]
    files = shown_path(data.get("train_files")) or (
        [data["dataset_name"]] if data.get("dataset_name") else []
    )
    if data.get("prepared_dir"):  # the run read only the directory, whatever train_files said
        files = f"the prepared directory `{shown_path(data['prepared_dir'])}` (`python -m mlm_adapt prepare`)"
    corpus = [("training data", files), *_replay_rows(data, info.replay)]
    corpus += [("validation data", _validation_data(data))]
    corpus += [(k.replace("_", " "), v) for k, v in info.corpus_stats.items()]
    segmentation, options = _segmentation(data), _masking(data)
    jieba = segmentation.segmenter in JIEBA_SEGMENTERS
    masking = [
        ("masking", f"{scheme} ({unit}); validation masks whole words whatever the training scheme"),
        ("segmenter", _segmenter(segmentation.segmenter)),
        ("segmented through OpenCC", segmentation.opencc),  # Traditional text, Simplified segmentation
        ("jieba HMM", segmentation.hmm if jieba else None),
        ("user dictionary", _user_dict(segmentation) if jieba else None),
        ("mlm_probability", options.schedule.describe()),
        ("eval_mlm_probability (validation masks)", options.eval_mlm_probability),
        ("mask_replace_prob ([MASK])", options.mask_replace_prob),
        ("random_replace_prob (random token)", options.random_replace_prob),
        ("max_seq_length", data.get("max_seq_length", info.model_hparams.get("max_seq_length"))),
        ("packing", as_options(BlockOptions, data.get("blocks"), "data.blocks").packing),
    ]
    for heading, rows in (("Corpus", corpus), ("Masking", masking), ("Training", _training_settings(info))):
        given = [(k, v) for k, v in rows if v is not None]
        lines += ["", f"## {heading}", ""] + [
            f"- {k}: {v if isinstance(v, str) and k in _VERBATIM else _fmt(v)}" for k, v in given
        ]
    lines += _replay_lines(info.replay)
    if info.merge:
        lines += _merge_lines(info.merge, base)
    lines += [
        "",
        f"The full resolved training configuration is in [`{CONFIG_FILENAME}`]({CONFIG_FILENAME}).",
        "",
    ]
    return ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n" + "\n".join(lines))
