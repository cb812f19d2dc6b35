"""Writing an adapted model as a Hugging Face directory: weights, tokenizer, resolved config, model card.

Used by the :class:`~mlm_adapt.callbacks.HFExport` callback at the end of ``fit`` and by
``python -m mlm_adapt export`` for any checkpoint the trainer wrote.
"""

from __future__ import annotations

import inspect
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
import yaml
from huggingface_hub import ModelCard, ModelCardData
from transformers import AutoModelForMaskedLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from mlm_adapt.checkpoints import callback_state, load_checkpoint, module_from_checkpoint
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.hub import check_hub_access, push_folder
from mlm_adapt.model import EVAL_METRICS

CONFIG_FILENAME = "training_config.yaml"
DEFAULT_TAGS = ("bert", "fill-mask", "chinese", "whole-word-masking", "domain-adaptation", "mlm_adapt")
PROBE_TEXTS = ("北京{mask}{mask}你！", "这本书的内容很好，值得一读。", "房间太小，{mask}务也很一般。")


@dataclass
class ExportInfo:
    """What the model card says about the run (all optional: missing facts are left out of the card).

    Args:
        model_hparams: ``MaskedLMModule`` hyperparameters (base model, sequence length, schedule).
        data_hparams: ``MLMDataModule`` hyperparameters (files, segmenter, masking probabilities).
        baseline_metrics: Validation metrics of the unadapted model (step 0).
        final_metrics: Validation metrics of the exported weights.
        final_metrics_step: The global step at which ``final_metrics`` were measured.
        corpus_stats: ``MLMDataModule.corpus_stats`` (documents, characters, tokens, examples).
        config_yaml: The resolved training config as written by LightningCLI.
        source: Which weights were exported (e.g. ``best checkpoint by val/loss: PATH``).
        global_step: Optimizer steps of the exported weights.
        epoch: Epoch of the exported weights.
        license: License identifier for the card metadata.
        tags: Hub tags.
        repo_id: Hub repository, used in the card's usage example.
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
    rows = [
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
    return [(k, v) for k, v in rows if v is not None]


def render_model_card(info: ExportInfo, title: str) -> ModelCard:
    """The ``README.md`` model card: Hub metadata, before/after metrics, corpus, masking and training."""
    base = str(info.model_hparams.get("model_name_or_path", "unknown"))
    data = info.data_hparams
    metadata = ModelCardData(
        language="zh",
        license=info.license,
        library_name="transformers",
        pipeline_tag="fill-mask",
        tags=list(info.tags),
        base_model=base if _is_hub_id(base) else None,  # the Hub only accepts repository ids here
    )
    target = info.repo_id or title
    lines = [
        f"# {title}",
        "",
        f"`{base}` adapted to domain text by continued masked-language-model pretraining with Chinese "
        "whole-word masking (mlm_adapt, PyTorch Lightning).",
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
        "(loss: cross-entropy over masked tokens; perplexity: its exponential).",
        "",
    ]
    before, after = info.baseline_metrics, info.final_metrics
    if before or after:
        after_head = (
            f"after (step {info.final_metrics_step})" if info.final_metrics_step is not None else "after"
        )
        lines += [f"| metric | before (step 0, `{base}`) | {after_head} |", "|---|---:|---:|"]
        for name in EVAL_METRICS:
            b, a = before.get(name), after.get(name)
            cells = [_fmt(v, 4) if v is not None else "n/a" for v in (b, a)]
            lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    else:
        lines.append("No validation metrics were recorded for this checkpoint.")
    files = data.get("train_files") or ([data["dataset_name"]] if data.get("dataset_name") else [])
    corpus = [("training data", files), ("validation data", data.get("validation_files"))]
    if not data.get("validation_files") and data.get("validation_split") is not None:
        corpus[-1] = (
            "validation data",
            f"{data['validation_split']:.1%} of the training documents, held out",
        )
    corpus += [(k.replace("_", " "), v) for k, v in info.corpus_stats.items()]
    masking = [
        ("masking", "whole-word masking (all tokens of a segmented word are masked together)"),
        ("segmenter", data.get("segmenter")),
        ("jieba HMM", data.get("hmm")),
        ("user dictionary", data.get("user_dict")),
        ("mlm_probability", data.get("mlm_probability")),
        ("mask_replace_prob ([MASK])", data.get("mask_replace_prob")),
        ("random_replace_prob (random token)", data.get("random_replace_prob")),
        ("max_seq_length", data.get("max_seq_length", info.model_hparams.get("max_seq_length"))),
        ("packing", data.get("packing")),
    ]
    for heading, rows in (("Corpus", corpus), ("Masking", masking), ("Training", _training_settings(info))):
        shown = [(k, v) for k, v in rows if v is not None or k == "user dictionary"]
        lines += ["", f"## {heading}", ""] + [
            f"- {k}: {v if isinstance(v, str) and k in ('masking', 'validation data') else _fmt(v)}"
            for k, v in shown
        ]
    lines += [
        "",
        f"The full resolved training configuration is in [`{CONFIG_FILENAME}`]({CONFIG_FILENAME}).",
        "",
    ]
    return ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n" + "\n".join(lines))


def probe_batch(tokenizer: PreTrainedTokenizerBase) -> dict[str, torch.Tensor]:
    """A small padded batch of probe sentences (with masks) for comparing logits."""
    texts = [t.format(mask=tokenizer.mask_token) for t in PROBE_TEXTS]
    return dict(tokenizer(texts, padding=True, return_tensors="pt"))


@torch.no_grad()
def verify_export(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: str | Path) -> float:
    """Reloads ``directory`` with the Auto classes and compares its logits with ``model``'s on a probe batch.

    Returns:
        The largest absolute logit difference (raises :class:`MLMAdaptError` above the tolerance).
    """
    param = next(model.parameters())
    reloaded = AutoModelForMaskedLM.from_pretrained(directory, dtype=param.dtype).to(param.device).eval()
    reloaded_tokenizer = AutoTokenizer.from_pretrained(directory)
    batch, reloaded_batch = probe_batch(tokenizer), probe_batch(reloaded_tokenizer)
    if not torch.equal(batch["input_ids"], reloaded_batch["input_ids"]):
        raise MLMAdaptError(
            f"export check failed: the tokenizer saved in {directory} encodes the probe differently"
        )
    was_training = model.training
    model.eval()  # dropout off, as in the reloaded model
    try:
        expected = model(**{k: v.to(param.device) for k, v in batch.items()}).logits.float()
    finally:
        model.train(was_training)
    actual = reloaded(**{k: v.to(param.device) for k, v in reloaded_batch.items()}).logits.float()
    diff = (expected - actual).abs().max().item()
    tolerance = 1e-4 if param.dtype == torch.float32 else 1e-2
    if not diff <= tolerance:
        raise MLMAdaptError(
            f"export check failed: logits of the reloaded {directory} differ from the checkpoint's by "
            f"{diff:.3g} (> {tolerance}); the export was not kept"
        )
    return diff


def check_output_dir(output_dir: str | Path, overwrite: bool, key: str = "--output_dir") -> None:
    """Refuses a non-empty output directory unless ``overwrite`` (checked before any work is done)."""
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise MLMAdaptError(f"{key}: {path} is a file; give a directory")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise MLMAdaptError(
            f"{key}: {path} is not empty; choose another directory or pass overwrite (--overwrite)"
        )


def _move_into(staging: Path, output_dir: Path) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    for entry in output_dir.iterdir():
        # Replace the previous export, but keep hidden entries (e.g. a .git of a cloned Hub repo).
        if not entry.name.startswith("."):
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    for entry in staging.iterdir():
        shutil.move(str(entry), output_dir / entry.name)


def write_export(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    output_dir: str | Path,
    info: ExportInfo,
    overwrite: bool = False,
    verify: bool = True,
) -> float | None:
    """Writes ``model`` + ``tokenizer`` (``save_pretrained``, safetensors), the config and the model card.

    Everything is written to a staging directory next to ``output_dir`` and checked there; ``output_dir``
    is only filled (with ``overwrite``: its previous non-hidden content replaced) once the check passed.

    Returns:
        The reload check's largest logit difference (``None`` when ``verify`` is off).
    """
    output_dir = Path(output_dir)
    check_output_dir(output_dir, overwrite)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.staging-", dir=output_dir.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / CONFIG_FILENAME).write_text(info.resolved_config(), encoding="utf-8")
        title = info.repo_id.rsplit("/", 1)[-1] if info.repo_id else output_dir.resolve().name
        render_model_card(info, title=title).save(staging / "README.md")
        diff = verify_export(model, tokenizer, staging) if verify else None
        _move_into(staging, output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return diff


def metrics_table(before: dict[str, float], after: dict[str, float]) -> str:
    """A plain-text before/after table of the validation metrics."""
    lines = [f"{'metric':<16}{'before':>12}{'after':>12}"]
    for name in EVAL_METRICS:
        b, a = before.get(name), after.get(name)
        lines.append(
            f"{name:<16}{'n/a' if b is None else f'{b:.4f}':>12}{'n/a' if a is None else f'{a:.4f}':>12}"
        )
    return "\n".join(lines)


def export(
    *,
    ckpt_path: str,
    output_dir: str,
    overwrite: bool = False,
    base_model: str | None = None,
    verify: bool = True,
    license: str = "apache-2.0",
    tags: list[str] | None = None,
    push_to_hub: bool = False,
    repo_id: str | None = None,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = "Upload adapted masked-LM (mlm_adapt)",
) -> None:
    """Writes a checkpoint of ``fit`` as a Hugging Face directory (and optionally pushes it to the Hub).

    Takes any checkpoint the trainer wrote: a ``.ckpt`` file (single device, DDP, FSDP full) or an FSDP
    sharded checkpoint directory (consolidated here). The directory gets safetensors weights, the tokenizer,
    training_config.yaml and a README.md model card with the before/after validation metrics; it is then
    reloaded with AutoModelForMaskedLM/AutoTokenizer and its logits compared with the checkpoint's.

    Args:
        ckpt_path: Checkpoint file or FSDP sharded checkpoint directory.
        output_dir: Directory to write; must be empty or absent unless --overwrite.
        overwrite: Replace the contents of a non-empty output_dir (hidden entries such as .git are kept).
        base_model: Base model directory or Hub name, if the one recorded in the checkpoint is not available
            here (its config and tokenizer are used; the weights come from the checkpoint).
        verify: Reload the export and compare its logits with the checkpoint's on a probe batch.
        license: License identifier in the model card.
        tags: Hub tags in the model card (default: bert, fill-mask, chinese, whole-word-masking, ...).
        push_to_hub: Upload the directory to the Hub (token from HF_TOKEN or `hf auth login`, never printed).
        repo_id: Hub repository NAME or ORG/NAME; required with --push_to_hub.
        private: Create the Hub repository as private.
        revision: Hub branch to commit to (created if missing); default main.
        commit_message: Hub commit message.
    """
    # Imported here: the callback module imports this one.
    from mlm_adapt.callbacks import HFExport

    transformers.logging.disable_progress_bar()
    check_output_dir(output_dir, overwrite)
    if push_to_hub:
        check_hub_access(repo_id)
    checkpoint = load_checkpoint(ckpt_path)
    module = module_from_checkpoint(checkpoint, base_model)
    data_hparams = dict(checkpoint.get("datamodule_hyper_parameters") or {})
    tokenizer_name = (
        base_model or data_hparams.get("tokenizer_name_or_path") or module.hparams.model_name_or_path
    )
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
    except Exception as exc:
        raise MLMAdaptError(
            f"--base_model: cannot load the tokenizer from {tokenizer_name!r}: {exc}"
        ) from exc
    if data_hparams.get("new_tokens_file"):
        from mlm_adapt.vocab import extend_tokenizer, read_new_tokens

        # The module was rebuilt with these tokens (model.new_tokens_file); the tokenizer needs them too.
        extend_tokenizer(tokenizer, read_new_tokens(data_hparams["new_tokens_file"]))
    state = callback_state(checkpoint, HFExport.__qualname__)
    history = {int(k): v for k, v in (state.get("val_history") or {}).items()}
    final, final_step = val_metrics_at(history, checkpoint.get("global_step"))
    info = ExportInfo(
        model_hparams=dict(checkpoint.get("hyper_parameters") or {}),
        data_hparams=data_hparams,
        baseline_metrics=module.baseline_metrics,
        final_metrics=final,
        final_metrics_step=final_step,
        corpus_stats=dict(state.get("corpus_stats") or {}),
        config_yaml=state.get("config_yaml"),
        source=f"checkpoint {ckpt_path}",
        global_step=checkpoint.get("global_step"),
        epoch=checkpoint.get("epoch"),
        license=license,
        tags=list(tags) if tags is not None else list(DEFAULT_TAGS),
        repo_id=repo_id if push_to_hub else None,
    )
    diff = write_export(module.model, tokenizer, output_dir, info, overwrite=overwrite, verify=verify)
    files = sorted(p.name for p in Path(output_dir).iterdir() if not p.name.startswith("."))
    print(f"wrote {output_dir}: {', '.join(files)}")
    if diff is not None:
        print(f"reload check: AutoModelForMaskedLM logits match the checkpoint (max |difference| {diff:.2e})")
    print(
        metrics_table(info.baseline_metrics, final) + (f"\n(after: step {final_step})" if final_step else "")
    )
    if push_to_hub:
        print(f"pushed to {push_folder(output_dir, repo_id, private, revision, commit_message)}")


def bare_flags(args: list[str], function: Any) -> list[str]:
    """Lets boolean options of ``function`` be given as bare flags: ``--overwrite`` -> ``--overwrite=true``.

    jsonargparse expects a value after a boolean option; the commands document ``--overwrite`` and
    ``--push_to_hub`` as flags, as users write them.
    """
    names = {
        f"--{n}" for n, p in inspect.signature(function).parameters.items() if p.annotation in (bool, "bool")
    }
    out = []
    for i, arg in enumerate(args):
        value_follows = i + 1 < len(args) and args[i + 1].lower() in ("true", "false")
        out.append(f"{arg}=true" if arg in names and not value_follows else arg)
    return out


def export_main(args: list[str]) -> None:
    """``python -m mlm_adapt export``."""
    from jsonargparse import auto_cli

    auto_cli(export, args=bare_flags(args, export), prog="python -m mlm_adapt export")
