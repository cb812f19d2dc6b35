"""Merging the adapted model back toward its base at export: θ = θ_base + α·(θ_adapted − θ_base), weight
interpolation as WiSE-FT and LM-Cocktail do it, with ``α`` given (``export.merge_alpha``) or chosen as the
largest whose general-text perplexity rise over the base stays within a budget (``export.merge_budget``)
with 95% confidence (:func:`rise_bound`).

The base is the run's step-0 model: ``model.model_name_or_path`` loaded as the run loaded it. Rows the base
does not have (tokens ``model.new_tokens_file`` added) keep their adapted values, as do the weights of a
masked-LM head the base lacked (an encoder-only or partial-head checkpoint): there is no base value to return
to. α is chosen on one half of the general validation blocks (even positions) and the merged weights are
reported on the other half (odd positions), so the reported rise is not the selection's own.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mlm_adapt.data.samplers import KeyedDataset
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.model.checkpoints import module_from_checkpoint
from mlm_adapt.model.loading import HEAD_TRAINED, head_parameters, load_masked_lm
from mlm_adapt.model.metrics import WordAccuracy, validation_prefix, word_keys
from mlm_adapt.model.module import CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_KEY, NEW_TOKENS_KEY, MaskedLMModule

Batch = dict[str, torch.Tensor]
# The search: these α from the top down to the first within the budget, then halving the step between it and
# the grid point above this many times (resolution 0.25 / 2**4 = 1/64).
GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
BISECTIONS = 4
# The halves of the general set: blocks at even positions choose α, odd ones report it.
SELECTION, HELD_OUT = "selection", "held_out"


def no_general_set(key: str) -> MLMAdaptError:
    """Why a budget cannot be judged: no general validation set (``key``: the budget's option)."""
    return MLMAdaptError(
        f"{key} needs a general validation set to measure forgetting on: give data.validation_files as a "
        "mapping, e.g. {domain: null, general: [general_val.txt]}"
    )


def base_weights(
    hparams: Mapping[str, Any], key: str, base_model: str | None = None
) -> dict[str, torch.Tensor]:
    """The weights the run started from (``model.model_name_or_path``, or ``base_model`` when the recorded one
    is not here), loaded as the run loaded them, on CPU; without the masked-LM head's when the base had no
    complete head. A run from random weights (``model.pretrained false``) has no base: one line naming
    ``key``."""
    if not hparams.get("pretrained", True):
        raise MLMAdaptError(
            f"{key}: the run started from random weights (model.pretrained false), so there is no base "
            "model to merge toward; drop the merge option"
        )
    name = base_model or hparams.get("model_name_or_path")
    if not name:
        raise MLMAdaptError(f"{key}: the run records no model.model_name_or_path; pass --base_model")
    model, head = load_masked_lm(
        str(name), True, hparams.get("attn_implementation", "sdpa"), bool(hparams.get("allow_partial_head"))
    )
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if head != HEAD_TRAINED:  # an untrained (random) head is no place to return to
        for name in head_parameters(model):
            state.pop(name, None)
    return state


def interpolate(
    base: Mapping[str, torch.Tensor], adapted: Mapping[str, torch.Tensor], alpha: float
) -> dict[str, torch.Tensor]:
    """``base + alpha * (adapted - base)`` for every floating tensor of ``adapted`` (``torch.lerp``: exactly
    ``base`` at 0 and ``adapted`` at 1); a tensor the base lacks, integer buffers and the rows past the base's
    (added vocabulary) keep their adapted values."""
    merged = {}
    for name, tensor in adapted.items():
        start = base.get(name)
        if start is None or not tensor.is_floating_point():
            merged[name] = tensor
            continue
        start = start.to(device=tensor.device, dtype=tensor.dtype)
        if start.shape == tensor.shape:
            merged[name] = torch.lerp(start, tensor, alpha)
            continue
        rows = start.shape[0] if start.ndim else 0
        if start.ndim != tensor.ndim or start.shape[1:] != tensor.shape[1:] or rows > tensor.shape[0]:
            raise MLMAdaptError(
                f"merge: the base's {name} has shape {tuple(start.shape)}, the adapted model's "
                f"{tuple(tensor.shape)}; give the base model the run started from (--base_model)"
            )
        out = tensor.clone()
        out[:rows] = torch.lerp(start, tensor[:rows], alpha)
        merged[name] = out
    return merged


def scoring_module(
    hparams: Mapping[str, Any], weights: Mapping[str, torch.Tensor], new_tokens: Sequence[str], key: str
) -> MaskedLMModule:
    """A module of the run's architecture holding ``weights`` (a masked-LM state dict), in eval mode on CPU:
    what the merge scores and swaps weights into, never the trainer's own module."""
    checkpoint = {
        CHECKPOINT_FORMAT_KEY: CHECKPOINT_FORMAT,
        "hyper_parameters": dict(hparams),
        "state_dict": {f"model.{k}": v for k, v in weights.items()},
        NEW_TOKENS_KEY: list(new_tokens),
    }
    return module_from_checkpoint(checkpoint, key=key)


@dataclass
class Sums:
    """The masked-token cross-entropies of some blocks (one per masked token, in order), how many of those
    tokens were predicted right, and how many masked words were (all their tokens right) of how many."""

    losses: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    correct: int = 0
    words_correct: int = 0
    words: int = 0

    def __add__(self, other: Sums) -> Sums:
        return Sums(
            torch.cat([self.losses, other.losses]),
            self.correct + other.correct,
            self.words_correct + other.words_correct,
            self.words + other.words,
        )

    @property
    def mean(self) -> float:
        return float(self.losses.mean()) if len(self.losses) else 0.0

    @property
    def perplexity(self) -> float:
        return math.exp(self.mean)

    def metrics(self, prefix: str) -> dict[str, float]:
        """The validation metrics these tokens give, as ``<prefix>/loss`` etc. are logged."""
        metrics = {
            f"{prefix}/loss": self.mean,
            f"{prefix}/accuracy": self.correct / max(len(self.losses), 1),
            f"{prefix}/perplexity": self.perplexity,
        }
        if self.words:
            metrics[f"{prefix}/word_accuracy"] = self.words_correct / self.words
        return metrics


# One-sided 95%: the chosen α keeps the rise within the budget with this confidence on text like the selection
# half (the bare estimate at the boundary would exceed it on other text half the time).
CONFIDENCE_Z = 1.645


def rise_bound(candidate: Sums, base: Sums, z: float = CONFIDENCE_Z) -> float:
    """The relative perplexity rise of ``candidate`` over ``base`` (the same masked tokens), plus ``z``
    standard errors of the mean paired loss difference: ``exp(mean(d) + z * sd(d) / sqrt(n)) - 1``."""
    difference = candidate.losses - base.losses
    n = len(difference)
    error = float(difference.std()) / math.sqrt(n) if n > 1 else 0.0
    return math.exp(float(difference.mean()) + z * error) - 1


@dataclass
class MergeData:
    """The validation batches the merge scores, collated once (fixed validation masks): ``domain`` is the
    first validation set (metrics ``val/*``), ``general`` the halves of the second (``<general>/*``), if any.
    """

    domain: list[Batch]
    general: dict[str, list[Batch]] = field(default_factory=dict)
    domain_prefix: str = "val"
    general_prefix: str | None = None


def split_batches(
    dataset: Any, collate: Callable[[list[Any]], Batch], blocks: int, batch_size: int, halves: bool
) -> list[Batch] | dict[str, list[Batch]]:
    """The first ``blocks`` items of ``dataset`` collated into batches of ``batch_size``; with ``halves``,
    ``{SELECTION: even positions, HELD_OUT: odd positions}``."""

    def batches(indices: list[int]) -> list[Batch]:
        return [
            collate([dataset[i] for i in indices[start : start + batch_size]])
            for start in range(0, len(indices), batch_size)
        ]

    indices = list(range(min(blocks, len(dataset))))
    if not halves:
        return batches(indices)
    return {SELECTION: batches(indices[0::2]), HELD_OUT: batches(indices[1::2])}


@dataclass
class MergeReport:
    """What the merge did: ``alpha`` and how it was chosen (``budget``: ``None`` when given), the scores of
    the base, adapted and merged weights (``figures``: domain on its whole set, general on the held-out half),
    the curve of the search (``(alpha, domain perplexity, general perplexity on the selection half)``), the
    merged weights' metrics on the whole of both sets (``merged_metrics``), and its cost."""

    alpha: float
    budget: float | None
    domain_prefix: str
    general_prefix: str | None
    figures: dict[str, dict[str, float]]
    curve: list[tuple[float, float | None, float | None]]
    merged_metrics: dict[str, float]
    evaluations: int
    seconds: float

    def describe(self) -> str:
        """One line: α, how it was chosen, what the merged weights score against the base, and the cost."""
        general = self.general_prefix
        if self.budget is None:
            how = "given (export.merge_alpha)"
        else:
            how = f"the largest within merge_budget={self.budget:g} (95% bound) on half the {general} blocks"
        parts = [f"α={self.alpha:.4g}, {how}"]
        if not self.figures:
            return parts[0] + "; not scored (no validation data here: score the export with validate)"
        domain = f"{self.domain_prefix}/perplexity"
        base, adapted, merged = (self.figures[w].get(domain) for w in ("base", "adapted", "merged"))
        if None not in (base, adapted, merged) and base != adapted:
            kept = (base - merged) / (base - adapted)
            parts.append(f"{domain} {base:.4g} -> {merged:.4g} ({kept:.0%} of the adapted reduction)")
        if general is not None:
            name = f"{general}/perplexity"
            base_g, merged_g = self.figures["base"][name], self.figures["merged"][name]
            half = " (held-out half)" if self.budget is not None else ""
            parts.append(f"{name}{half} {base_g:.4g} -> {merged_g:.4g} ({merged_g / base_g - 1:+.1%})")
        parts.append(f"{self.evaluations} evaluations in {self.seconds:.1f} s")
        return "; ".join(parts)

    def table(self) -> str:
        """Base, adapted and merged perplexity of each set, as the figures were measured ("" without)."""
        if not self.figures:
            return ""
        rows = [(f"{self.domain_prefix}/perplexity", "")]
        if self.general_prefix is not None:
            held = " (held-out half)" if self.budget is not None else ""
            rows.append((f"{self.general_prefix}/perplexity", held))
        head = f"merged α={self.alpha:.4g}"
        width = max(len(n + h) for n, h in rows) + 2
        lines = [f"{'perplexity':<{width}}{'base':>12}{'adapted':>12}{head:>16}"]
        for name, note in rows:
            cells = [self.figures[w][name] for w in ("base", "adapted", "merged")]
            lines.append(f"{name + note:<{width}}{cells[0]:>12.4f}{cells[1]:>12.4f}{cells[2]:>16.4f}")
        return "\n".join(lines)

    def plain(self) -> dict[str, Any]:
        """The report as plain values (what the model card and the curve are drawn from)."""
        return asdict(self)


class Scorer:
    """Scores weights of ``module`` (a :class:`MaskedLMModule`, whose model they are loaded into) on the
    batches of :class:`MergeData`, in eval mode without gradients, as validation does."""

    def __init__(
        self,
        module: MaskedLMModule,
        device: torch.device | str = "cpu",
        context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    ):
        self.module = module.to(device).eval()
        self.device = torch.device(device)
        self.context = context
        self.evaluations = 0

    def load(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.module.model.load_state_dict(weights)

    @torch.no_grad()
    def sums(self, batches: Sequence[Batch]) -> Sums:
        self.evaluations += 1
        losses, correct, words = [], 0, WordAccuracy()
        with self.context():
            for batch in batches:
                batch = {k: v.to(self.device) for k, v in batch.items()}
                logits, labels = self.module.masked_logits(batch)
                losses.append(F.cross_entropy(logits.float(), labels, reduction="none").double().cpu())
                right = logits.argmax(-1) == labels
                correct += int(right.sum())
                if "word_ids" in batch:  # as validation scores words (model.metrics.WordAccuracy)
                    words.update(right.cpu(), word_keys(batch["word_ids"], batch["labels"] != -100).cpu())
        found = torch.cat(losses) if losses else Sums().losses
        return Sums(found, correct, int(words.correct), int(words.total))


def choose_alpha(rise: Callable[[float], float], budget: float) -> float:
    """The largest α of :data:`GRID` whose ``rise(α)`` (relative general perplexity rise over α = 0, or its
    :func:`rise_bound`) is within ``budget``, tried from the top (so a curve that dips below the budget again
    at larger α is found there), then :data:`BISECTIONS` halvings of the step to the next grid point (which
    is not within it)."""
    low = next((alpha for alpha in reversed(GRID) if rise(alpha) <= budget), GRID[0])
    if low == GRID[-1]:
        return low
    high = GRID[GRID.index(low) + 1]
    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        if rise(middle) <= budget:
            low = middle
        else:
            high = middle
    return low


def merge(
    scorer: Scorer,
    base: Mapping[str, torch.Tensor],
    data: MergeData | None,
    alpha: float | None = None,
    budget: float | None = None,
) -> MergeReport:
    """Merges the scorer's module weights (the adapted ones) toward ``base`` with ``alpha`` or, under
    ``budget``, the α :func:`choose_alpha` picks on the selection half of ``data.general``; leaves the merged
    weights in the module and returns the report (without figures when there is no ``data`` to score)."""
    started = time.perf_counter()
    adapted = {k: v.detach().to("cpu", copy=True) for k, v in scorer.module.model.state_dict().items()}
    general = data.general_prefix if data is not None else None
    # (alpha, part) -> Sums, part: "domain", SELECTION or HELD_OUT.
    scores: dict[tuple[float, str], Sums] = {}

    def score(a: float, part: str) -> Sums:
        if (a, part) not in scores:
            scorer.load(interpolate(base, adapted, a))
            scores[a, part] = scorer.sums(data.domain if part == "domain" else data.general[part])
        return scores[a, part]

    curve: list[tuple[float, float | None, float | None]] = []
    if budget is not None:
        if general is None:
            raise no_general_set("merge_budget")
        alpha = choose_alpha(lambda a: rise_bound(score(a, SELECTION), score(0.0, SELECTION)), budget)
    if alpha is None:
        raise ValueError("merge: give alpha or budget")
    # The general figures: the held-out half when α was chosen on the other, else the whole set.
    reported = [HELD_OUT] if budget is not None else [SELECTION, HELD_OUT]
    figures: dict[str, dict[str, float]] = {}
    merged_metrics: dict[str, float] = {}
    if data is not None:
        for name, a in (("base", 0.0), ("adapted", 1.0), ("merged", alpha)):
            figures[name] = {f"{data.domain_prefix}/perplexity": score(a, "domain").perplexity}
            if general is not None:
                sums = sum((score(a, p) for p in reported), Sums())
                figures[name][f"{general}/perplexity"] = sums.perplexity
        merged_metrics = score(alpha, "domain").metrics(data.domain_prefix)
        if general is not None:
            merged_metrics |= (score(alpha, SELECTION) + score(alpha, HELD_OUT)).metrics(general)
    if budget is not None:  # every α the search scored, with the domain where it was scored too
        evaluated = sorted(a for a, part in scores if part == SELECTION)
        domain = {a: s.perplexity for (a, part), s in scores.items() if part == "domain"}
        curve = [(a, domain.get(a), scores[a, SELECTION].perplexity) for a in evaluated]
    scorer.load(interpolate(base, adapted, alpha))
    return MergeReport(
        alpha=alpha,
        budget=budget,
        domain_prefix=data.domain_prefix if data is not None else "val",
        general_prefix=general,
        figures=figures,
        curve=curve,
        merged_metrics=merged_metrics,
        evaluations=scorer.evaluations,
        seconds=time.perf_counter() - started,
    )


def check_merge_run(model_hparams: Any, datamodule: Any, budget: float | None) -> None:
    """Refuses, before training, a merge the run cannot give: from random weights (no base to return to),
    or under a budget without a general validation set to measure it on."""
    option = "export.merge_budget" if budget is not None else "export.merge_alpha"
    if not (model_hparams or {}).get("pretrained", True):
        raise MLMAdaptError(
            f"{option}: the run starts from random weights (model.pretrained false), so there is no base "
            "model to merge toward; drop the merge option"
        )
    if budget is not None and len(getattr(datamodule, "validation_set_names", None) or []) < 2:
        raise no_general_set(option)


def merge_data(datamodule: Any, scored: Sequence[int | float] = ()) -> MergeData:
    """The validation blocks a merge scores, collated with the fixed validation masks: of the first set
    and, in halves, of the second, as many batches of each as validation scored (``scored``, by set, e.g.
    ``trainer.num_val_batches``; all of a set it does not name)."""
    names = list(datamodule.validation_set_names)
    size = datamodule.eval_batch_size

    def batches(index: int, halves: bool) -> Any:
        dataset = KeyedDataset(datamodule.val_datasets[names[index]])
        limit = scored[index] if index < len(scored) else math.inf
        blocks = len(dataset) if limit == math.inf else int(limit) * size
        return split_batches(dataset, datamodule.collator, blocks, size, halves=halves)

    if len(names) < 2:
        return MergeData(domain=batches(0, False))
    return MergeData(
        domain=batches(0, False), general=batches(1, True), general_prefix=validation_prefix(1, names)
    )


def limited_batches(limit: int | float | None, batches: int) -> int | float:
    """How many of a set's ``batches`` Lightning's validation scores under ``trainer.limit_val_batches``:
    an int is a count (``1``: one batch), a float a fraction (``1.0``: all), ``None`` all."""
    if limit is None:
        return batches
    if isinstance(limit, int):
        return min(limit, batches)
    return int(batches * limit)


def checkpoint_merge_data(
    datamodule: Any, tokenizer: Any, limit_val_batches: int | float | None
) -> MergeData:
    """The validation blocks of ``datamodule`` (the user's config) for merging a checkpoint, refused in one
    line when its tokenizer is not the checkpoint's (the blocks would be other token ids)."""
    if datamodule.tokenizer.get_vocab() != tokenizer.get_vocab():
        raise MLMAdaptError(
            f"--data_config: its tokenizer ({datamodule.hparams.tokenizer_name_or_path}, with "
            "model.new_tokens_file if any) is not the checkpoint's; give the fit config of the run that "
            "wrote --ckpt_path"
        )
    datamodule.prepare_data()
    datamodule.setup("validate")
    size = datamodule.eval_batch_size
    counts = [math.ceil(len(d) / size) for d in datamodule.val_datasets.values()]
    return merge_data(datamodule, [limited_batches(limit_val_batches, n) for n in counts])


# The α curve drawn into the export next to the card (the card shows it).
CURVE_FILENAME = "merge_curve.png"


def draw_curve(report: Mapping[str, Any], path: str | Path) -> None:
    """Draws the search's curve of a :meth:`MergeReport.plain` ``report`` into the PNG ``path``: general
    (selection half) and domain perplexity against α, the budget's line and the chosen α."""
    # Heavy and only needed here; the backend must be chosen before pyplot is imported.
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    curve, alpha, budget = report["curve"], report["alpha"], report["budget"]
    general, domain = report["general_prefix"], report["domain_prefix"]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot([a for a, _, g in curve], [g for _, _, g in curve], "o-", label=f"{general} (selection half)")
    points = [(a, d) for a, d, _ in curve if d is not None]
    ax.plot([a for a, _ in points], [d for _, d in points], "s--", label=f"{domain}")
    base = curve[0][2]
    ax.axhline(base * (1 + budget), color="grey", lw=0.8, ls=":", label=f"{general} budget (+{budget:.0%})")
    ax.axvline(alpha, color="black", lw=0.8, label=f"exported α = {alpha:.4g}")
    ax.set_xlabel("α (0: base, 1: adapted)")
    ax.set_ylabel("perplexity")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=90, format="png")
    finally:
        plt.close(fig)
