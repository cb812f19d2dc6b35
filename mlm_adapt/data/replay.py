"""General-text replay at sampling time, and the controller that holds forgetting to a budget.

Replay (``data.replay.files``) keeps the general text as its own blocks; every training slot (one example of
one batch) takes a general block instead of its domain block with the step's *replay rate*. Which slots do,
and which block each takes, is a pure function of the slot's masking key (:mod:`mlm_adapt.masking.collator`):
the same on every rank and worker layout and after an exact resume, like the masks. The draw happens in the
main process right before the step (``MLMDataModule.on_before_batch_transfer``), not in the sampler or the
workers, which run batches ahead: the rate of step ``s`` is the rate after every check up to ``s``.

The rate is fixed (``data.replay.rate``) or moved by :meth:`Replay.update` after each forgetting check
(``forgetting.budget``): ``rate <- clip(rate + GAIN * (rise - TARGET * budget) / budget, 0, max_rate)``,
each change at most ``MAX_CHANGE``, the integral controller of docs/training.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import datasets
import numpy as np
import torch
import torch.nn.functional as F

from mlm_adapt.data.forgetting import ForgettingOptions
from mlm_adapt.data.samplers import keyed_item
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.masking.collator import key_array, mix32
from mlm_adapt.masking.schedule import RateSchedule, RateSpec, parse_schedule

# Salts of the two draws per slot: whether it replays, and which general block it takes.
_REPLAY_SALT = np.uint32(0x5EED_6E01)
_INDEX_SALT = np.uint32(0x1D3A_B6C5)
# Example ids of replayed rows start here (domain ids are dataset indices, far below): their masks are their
# own, a function of the slot, so a general block drawn twice is masked anew.
GENERAL_EXAMPLE_ID = 1 << 40

# The controller (see the module docstring).
GAIN = 0.5
TARGET = 0.75
MAX_CHANGE = 0.2

# The replay settings a resumed run may change, by option: the resume says so in one line (old -> new) and
# the card records every segment. Unlike the settings a checkpoint fixes
# (mlm_adapt.training.resume.FIXED_SETTINGS), nothing restored depends on them: the controller continues
# from the checkpoint's rate and baseline.
REPLAY_SETTINGS = (
    "forgetting.budget",
    "data.replay.rate",
    "forgetting.max_replay_rate",
    "data.replay.files",
    "forgetting.check_interval",
    "forgetting.check_batches",
)

# General text read for nothing: a warning when the blocks are set up.
IDLE_REPLAY = (
    "mlm_adapt: data.replay.files is read, segmented and packed, but nothing of it is replayed: "
    "data.replay.rate is 0 and forgetting.budget is unset; set one of them (e.g. "
    "data.replay.rate: 0.1 or forgetting.budget: 0.2), or drop data.replay.files"
)

# What padding holds in each per-token column of a collated batch.
_PAD = {"attention_mask": 0, "word_ids": -1, "labels": -100, "document_ids": -1, "position_ids": 0}


@dataclass(kw_only=True, frozen=True)
class ReplayOptions:
    """General-domain text replayed during training to limit forgetting (``data.replay``; docs/training.md).

    Args:
        files: General-domain text files or globs, kept as blocks of their own.
        rate: The replay rate: the fraction of training examples drawn from ``files`` (0: none), or
            ``[fraction_of_training, rate]`` points; with ``forgetting.budget`` the starting rate (moved up
            to ``forgetting.max_replay_rate``). Logged as ``train/replay_rate``.
    """

    files: list[str] | None = None
    rate: RateSpec = 0.0

    @cached_property
    def schedule(self) -> RateSchedule:
        """The replay rate over the run: a rate in [0, 1) or ``[[fraction_of_training, rate], ...]``."""
        example = "e.g. 0.2 or [[0.0, 0.1], [1.0, 0.3]]"
        return parse_schedule(self.rate, "data.replay.rate", zero_allowed=True, example=example)

    def check(self) -> ReplayOptions:
        """Refuses a bad rate, or a rate above 0 with no files, in one line; returns the options."""
        if max(rate for _, rate in self.schedule.points) > 0 and not self.files:
            raise MLMAdaptError("data.replay.rate > 0 needs data.replay.files (general-domain text files)")
        return self


def replayed_slots(keys: torch.Tensor, rate: float, n_general: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, general_indices)``: the rows of a batch (by their masking keys, ``example_keys``) whose
    draw is below the step's ``rate``, and for each a block index uniform over the ``n_general`` blocks."""
    if rate <= 0 or n_general == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    k = key_array(keys)
    # The top 24 bits as a uniform in [0, 1), as the masking draws; a 32-bit hash for the index.
    draw = (mix32(k ^ _REPLAY_SALT) >> np.uint32(8)).astype(np.float64) / (1 << 24)
    rows = np.flatnonzero(draw < rate)
    indices = mix32(k[rows] ^ _INDEX_SALT).astype(np.int64) % n_general
    return rows, indices


def replace_rows(
    batch: dict[str, torch.Tensor], rows: np.ndarray, other: dict[str, torch.Tensor], pad_token_id: int
) -> dict[str, torch.Tensor]:
    """``batch`` with ``rows`` replaced by the rows of ``other`` (collated alike), per-token columns padded
    to a common length with what padding holds (``attention_mask`` 0, labels -100, ...)."""
    if len(rows) == 0:
        return batch
    length = max(batch["input_ids"].shape[1], other["input_ids"].shape[1])
    index = torch.from_numpy(rows)
    merged = {}
    for key, value in batch.items():
        if key not in other:
            # Only a collator other than the training one could leave a column out.
            raise MLMAdaptError(f"replayed rows lack the batch column {key!r}")
        new = other[key]
        if value.dim() == 2:  # F.pad returns a new tensor: the batch's own stays untouched
            pad = pad_token_id if key == "input_ids" else _PAD.get(key, 0)
            value = F.pad(value, (0, length - value.shape[1]), value=pad)
            new = F.pad(new, (0, length - new.shape[1]), value=pad)
        elif value.dim() == 0:
            merged[key] = value
            continue
        else:
            value = value.clone()
        value[index] = new.to(value.dtype)
        merged[key] = value
    return merged


@dataclass
class Check:
    """One forgetting check: the step, the check's perplexity, and the rate decided after it."""

    step: int
    perplexity: float
    rate: float


@dataclass
class Replay:
    """The replay rate of every step (``data.replay.rate``; with ``forgetting.budget``, the starting rate,
    moved up to ``forgetting.max_replay_rate``), the draw of ``general`` blocks and the controller's state."""

    general: datasets.Dataset
    schedule: RateSchedule
    budget: float | None = None
    max_rate: float = 0.5
    controlled_rate: float | None = None
    baseline: float | None = None
    checks: list[Check] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.budget is not None and self.controlled_rate is None:
            self.controlled_rate = self.schedule.initial_rate

    def rate(self, step: int, total_steps: int) -> float:
        """The replay rate of optimizer step ``step``: the controller's, else the schedule's."""
        if self.controlled_rate is not None:
            return self.controlled_rate
        return self.schedule.rate_at_step(step, total_steps)

    def mix(
        self,
        batch: dict[str, torch.Tensor],
        rate: float,
        collate: Callable[[Sequence[dict[str, Any]]], dict[str, torch.Tensor]],
        pad_token_id: int,
        mlm_probability: float | None = None,
    ) -> dict[str, torch.Tensor]:
        """Replaces the drawn rows of a batch of the training collator ``collate`` with general blocks
        (masked at the step's ``mlm_probability`` when it is scheduled, as the domain rows); adds
        ``replay_rate`` and ``replayed`` (which rows are general blocks)."""
        rows, indices = replayed_slots(batch["example_keys"], rate, len(self.general))
        replayed = torch.zeros(batch["input_ids"].shape[0], dtype=torch.bool)
        replayed[torch.from_numpy(rows)] = True
        if len(rows):
            slot_keys = key_array(batch["example_keys"])[rows].astype(np.int64)
            features = [
                keyed_item(self.general[int(index)], GENERAL_EXAMPLE_ID + int(slot_key), 0, mlm_probability)
                for slot_key, index in zip(slot_keys, indices, strict=True)
            ]
            batch = replace_rows(batch, rows, collate(features), pad_token_id)
        batch["replay_rate"] = torch.tensor(rate, dtype=torch.float32)
        batch["replayed"] = replayed
        return batch

    def update(self, step: int, perplexity: float) -> tuple[float, float]:
        """Records a forgetting check and moves the controlled rate; returns ``(old_rate, new_rate)``. The
        first check (step 0, or the resumed step where a budget was added on resume) is the baseline and
        changes nothing; a later non-finite perplexity is recorded as ``inf``."""
        old = float(self.controlled_rate or 0.0)
        if not math.isfinite(perplexity):
            if self.baseline is None:
                raise MLMAdaptError(
                    f"forgetting.budget: the general set's perplexity at the baseline check (step "
                    f"{step}) is {perplexity}: the weights or the general validation text give no finite loss"
                )
            perplexity = math.inf  # diverged weights: the most forgetting there is (the rate goes up)
        if self.baseline is None:
            self.baseline = perplexity
            self.checks.append(Check(step, perplexity, old))
            return old, old
        rise = self.rise(perplexity)
        change = GAIN * (rise - TARGET * self.budget) / self.budget
        change = max(-MAX_CHANGE, min(MAX_CHANGE, change)) if math.isfinite(change) else MAX_CHANGE
        new = round(min(self.max_rate, max(0.0, old + change)), 4)
        self.controlled_rate = new
        self.checks.append(Check(step, perplexity, new))
        return old, new

    def rise(self, perplexity: float) -> float:
        """Relative rise of a check's perplexity over the baseline check (a finite baseline > 0)."""
        return perplexity / self.baseline - 1

    def summary(self, segments: Sequence[Sequence[Any]] | None = None) -> dict[str, Any]:
        """The budget, the rate trajectory and whether the last check held (for the table and the card)."""
        return replay_summary(self.state_dict(), segments)

    def state_dict(self) -> dict[str, Any]:
        """Plain values for checkpoints."""
        return {
            "rate": self.controlled_rate,
            "baseline": self.baseline,
            "checks": [[c.step, c.perplexity, c.rate] for c in self.checks],
            "budget": self.budget,
            "max_rate": self.max_rate,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores the controller after an exact resume. The checks are kept whatever the budget now is
        (the card reports them); the rate is the checkpoint's only under a budget, capped at a lowered
        ``max_rate``. A state without a controller's rate (a fixed-rate run given a budget on resume)
        leaves the starting rate, and the next check is the baseline."""
        self.baseline = state["baseline"]
        self.checks = [Check(*check) for check in state["checks"]]
        if self.budget is None:
            self.controlled_rate = None  # the schedule's rate from here (data.replay.rate)
        elif state["rate"] is not None:
            self.controlled_rate = min(state["rate"], self.max_rate)

    @property
    def baseline_step(self) -> int:
        """The step of the baseline check (0, or the resumed step where a budget was added on resume)."""
        return self.checks[0].step if self.checks else 0


def _plain(value: Any) -> Any:
    """Tuples as lists, all the way down (YAML and checkpoints have no tuples)."""
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def replay_settings(replay: ReplayOptions, forgetting: ForgettingOptions) -> dict[str, Any]:
    """The run's :data:`REPLAY_SETTINGS` (its ``replay`` and ``forgetting`` options), as plain values: what a
    segment of the run replayed under."""
    values = {
        "data.replay.rate": replay.rate,
        "data.replay.files": replay.files,
        "forgetting.budget": forgetting.budget,
        "forgetting.max_replay_rate": forgetting.max_replay_rate,
        "forgetting.check_interval": forgetting.check_interval,
        "forgetting.check_batches": forgetting.check_batches,
    }
    return {name: _plain(values[name]) for name in REPLAY_SETTINGS}


def setting_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``OPTION OLD -> NEW`` for every replay setting that differs between two segments."""
    return [
        f"{name} {old.get(name)!r} -> {new.get(name)!r}"
        for name in REPLAY_SETTINGS
        if _plain(old.get(name)) != _plain(new.get(name))
    ]


def resume_line(step: int, old: Mapping[str, Any], new: Mapping[str, Any], checked: bool) -> str | None:
    """The one line of a resume at ``step`` whose replay settings ``new`` differ from the checkpoint's last
    segment ``old`` (``None`` when none differs); ``checked``: the checkpoint's replay state holds checks."""
    changes = setting_changes(old, new)
    if not changes:
        return None
    if new.get("forgetting.budget") is None:
        effect = "no budget from here: the replay rate is data.replay.rate's"
    elif old.get("forgetting.budget") is None and not checked:
        effect = f"the budget's baseline is the check at step {step}, and rises are measured from there"
    else:
        effect = "the controller continues from the checkpoint's rate and baseline"
    return (
        f"mlm_adapt replay: resuming at step {step} with changed replay settings: {'; '.join(changes)} "
        f"({effect}; each check is judged against the budget in force when it ran, and the card records "
        "every segment)"
    )


def _budget_at(segments: Sequence[Sequence[Any]], step: int) -> float | None:
    """The budget a check at ``step`` ran under: that of the last segment that started before it (a
    segment from step ``s`` trains steps after ``s``; the check at ``s`` ended the one before)."""
    budget = segments[0][1].get("forgetting.budget")
    for first, settings in segments[1:]:
        if first < step:
            budget = settings.get("forgetting.budget")
    return budget


def replay_summary(
    state: dict | None, segments: Sequence[Sequence[Any]] | None = None, until_step: int | None = None
) -> dict[str, Any]:
    """What a run's replay did, from a :meth:`Replay.state_dict` and the run's ``segments``, up to the
    weights of step ``until_step`` when given (the checks and segments after it are left out: an export of
    an earlier step's weights reports what replay had done to those).

    ``segments`` (``[first_step, settings]`` of each stretch between resumes that changed a replay
    setting) when there is more than one; with checks of a budget also ``budget`` (that of the last check),
    ``baseline_step``, ``checks`` (how many ran after the baseline), ``last_check`` (its step),
    ``trajectory`` (``[step, rate, rise]`` where the rate changed, and the first and last),
    ``final_rate``, ``mean_rate``, ``last_rise`` and ``held`` (within the budget): the last two ``None``
    when no check ran after the baseline (not measured); ``later_checks``: how many checks after
    ``until_step`` were left out, if any. ``{}`` when there is nothing to report."""
    state = state or {}  # None: a run without replay
    last = math.inf if until_step is None else until_step
    segments = [list(segment) for segment in segments or [] if segment[0] <= last]
    summary: dict[str, Any] = {"segments": segments} if len(segments) > 1 else {}
    every_check, baseline = state.get("checks") or [], state.get("baseline")
    checks = [c for c in every_check if c[0] <= last]
    budgets = [_budget_at(segments, int(check[0])) if segments else state.get("budget") for check in checks]
    budget = next((b for b in reversed(budgets) if b is not None), state.get("budget"))
    if not checks or not baseline or budget is None:
        return summary
    points = [(int(s), float(r), float(p) / baseline - 1) for s, p, r in checks]
    trajectory = [p for i, p in enumerate(points) if i in (0, len(points) - 1) or p[1] != points[i - 1][1]]
    spans = [(b[0] - a[0], a[1]) for a, b in zip(points, points[1:], strict=False)]
    total = sum(n for n, _ in spans)
    measured = len(points) > 1  # the baseline alone measures nothing
    return {
        **summary,
        "budget": budget,
        "baseline_step": points[0][0],
        "checks": len(points) - 1,
        "last_check": points[-1][0],
        "trajectory": [[s, round(r, 4), round(x, 4)] for s, r, x in trajectory],
        "final_rate": points[-1][1],
        "mean_rate": sum(n * r for n, r in spans) / total if total else points[-1][1],
        "last_rise": points[-1][2] if measured else None,
        "held": points[-1][2] <= budget if measured else None,
        **({"later_checks": len(every_check) - len(checks)} if len(checks) < len(every_check) else {}),
    }


def segment_columns(segments: Sequence[Sequence[Any]]) -> list[str]:
    """The replay settings that tell the segments apart: the budget, and every other one that changed."""
    changed = [n for n in REPLAY_SETTINGS if len({repr(s.get(n)) for _, s in segments}) > 1]
    return ["forgetting.budget", *(n for n in changed if n != "forgetting.budget")]


def summary_from_checkpoint(state: dict[str, Any] | None) -> dict[str, Any]:
    """:func:`replay_summary` of a checkpoint's DataModule state (``MLMDataModule.state_dict``); a
    checkpoint without one reports nothing."""
    state = state or {}
    return replay_summary(state.get("replay"), state.get("replay_segments"))


def describe_segments(segments: Sequence[Sequence[Any]]) -> str:
    """``from step 0: forgetting.budget=0.2; from step 40: forgetting.budget=0.1, ...``: every segment's
    budget and the other replay settings that differ between segments."""
    names = segment_columns(segments)
    return "; ".join(
        f"from step {first}: " + ", ".join(f"{n}={settings.get(n)!r}" for n in names)
        for first, settings in segments
    )


def describe_replay(summary: dict[str, Any]) -> str:
    """One line of a :func:`replay_summary` with a budget: ``replay rate 0 (step 0) -> 0.1 (step 20) -> ...;
    mean 0.12; general perplexity +14.0% over step 0 at the last check (step 200, 10 checks after step 0;
    budget +20%: held)``, or ``not measured`` when no check ran after the baseline."""
    steps = " -> ".join(f"{r:g} (step {s})" for s, r, _ in summary["trajectory"])
    budget, base = f"budget +{summary['budget']:.0%}", summary["baseline_step"]
    if summary["held"] is None:
        line = (
            f"not measured: no check ran after the baseline at step {base} ({budget}; "
            f"forgetting.check_interval is longer than the steps that followed); replay rate {steps}"
        )
    else:
        held = "held" if summary["held"] else "exceeded"
        line = (
            f"replay rate {steps}; mean {summary['mean_rate']:.3f}; general perplexity "
            f"{summary['last_rise']:+.1%} over step {base} at the last check (step {summary['last_check']}, "
            f"{summary['checks']} check(s) after step {base}; {budget}: {held})"
        )
    if "segments" in summary:
        line += f"; replay settings by segment: {describe_segments(summary['segments'])}"
    return line
