"""General-text replay at sampling time, and the controller that holds forgetting to a budget.

Replay (``data.mix_files``) keeps the general text as its own blocks; every training slot (one example of one
batch) takes a general block instead of its domain block with the step's *mix rate*. Which slots do, and
which block each takes, is a pure function of the slot's masking key (:mod:`mlm_adapt.masking.collator`): the
same on every rank and worker layout and after an exact resume, like the masks. The draw happens in the main
process right before the step (``MLMDataModule.on_before_batch_transfer``), not in the sampler or the
workers, which run batches ahead: the rate of step ``s`` is the rate after every check up to ``s``.

The rate is fixed (``data.mix_probability``) or moved by :meth:`Replay.update` after each forgetting check
(``data.forgetting_budget``): ``rate <- clip(rate + GAIN * (rise - TARGET * budget) / budget, 0, max_rate)``,
each change at most ``MAX_CHANGE``, the integral controller of docs/training.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import datasets
import numpy as np
import torch
import torch.nn.functional as F

from mlm_adapt.data.samplers import keyed_item
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.masking.collator import key_array, mix32
from mlm_adapt.masking.schedule import MaskingSchedule, RateSpec, parse_schedule

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

# What padding holds in each per-token column of a collated batch.
_PAD = {"attention_mask": 0, "word_ids": -1, "labels": -100, "document_ids": -1, "position_ids": 0}


def parse_mix_rate(value: RateSpec) -> MaskingSchedule:
    """``data.mix_probability``: a rate in [0, 1) or ``[[fraction_of_training, rate], ...]`` points."""
    example = "e.g. 0.2 or [[0.0, 0.1], [1.0, 0.3]]"
    return parse_schedule(value, "data.mix_probability", zero_allowed=True, example=example)


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
    """The mix rate of every step (``data.mix_probability``; with ``data.forgetting_budget``, the starting
    rate, moved up to ``data.max_mix_rate``), the draw of ``general`` blocks and the controller's state."""

    general: datasets.Dataset
    schedule: MaskingSchedule
    budget: float | None = None
    max_rate: float = 0.5
    controlled_rate: float | None = None
    baseline: float | None = None
    checks: list[Check] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.budget is not None and self.controlled_rate is None:
            self.controlled_rate = self.schedule.initial_rate

    def rate(self, step: int, total_steps: int) -> float:
        """The mix rate of optimizer step ``step``: the controller's, else the schedule's."""
        if self.controlled_rate is not None:
            return self.controlled_rate
        return self.schedule.rate_at_step(step, total_steps)

    def mix(
        self,
        batch: dict[str, torch.Tensor],
        rate: float,
        collate: Callable[[Sequence[dict[str, Any]]], dict[str, torch.Tensor]],
        pad_token_id: int,
        mask_rate: float | None = None,
    ) -> dict[str, torch.Tensor]:
        """Replaces the drawn rows of a batch of the training collator ``collate`` with general blocks
        (masked at the step's ``mask_rate`` when it is scheduled, as the domain rows); adds ``mix_rate``."""
        rows, indices = replayed_slots(batch["example_keys"], rate, len(self.general))
        if len(rows):
            slot_keys = key_array(batch["example_keys"])[rows].astype(np.int64)
            features = [
                keyed_item(self.general[int(index)], GENERAL_EXAMPLE_ID + int(slot_key), 0, mask_rate)
                for slot_key, index in zip(slot_keys, indices, strict=True)
            ]
            batch = replace_rows(batch, rows, collate(features), pad_token_id)
        batch["mix_rate"] = torch.tensor(rate, dtype=torch.float32)
        return batch

    def update(self, step: int, perplexity: float) -> tuple[float, float]:
        """Records a forgetting check and moves the controlled rate; returns ``(old_rate, new_rate)``. The
        first check (step 0) is the baseline and changes nothing."""
        old = float(self.controlled_rate or 0.0)
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
        """Relative rise of a check's perplexity over the step-0 check."""
        return perplexity / self.baseline - 1 if self.baseline else 0.0

    def summary(self) -> dict[str, Any]:
        """The budget, the rate trajectory and whether the last check held (for the table and the card)."""
        return replay_summary(self.state_dict())

    def state_dict(self) -> dict[str, Any]:
        """Plain values for checkpoints."""
        return {
            "rate": self.controlled_rate,
            "baseline": self.baseline,
            "checks": [[c.step, c.perplexity, c.rate] for c in self.checks],
            "budget": self.budget,
        }

    def load_state_dict(self, state: Any) -> None:
        """Restores the controller after an exact resume; a state of another shape (an altered checkpoint)
        is refused before any step."""
        if self.budget is None:
            return  # a fixed rate has no state (a resumed run may drop the budget: it keeps its rate)
        try:
            rate, baseline = state.get("rate", self.controlled_rate), state.get("baseline")
            checks = [Check(int(s), float(p), float(r)) for s, p, r in state.get("checks", [])]
            values = [rate, baseline or 1.0, *(c.perplexity for c in checks), *(c.rate for c in checks)]
            if rate is not None and not all(math.isfinite(float(v)) and float(v) >= 0 for v in values):
                raise ValueError("negative or non-finite values")
        except (AttributeError, TypeError, ValueError) as exc:
            raise MLMAdaptError(
                f"ckpt_path: the checkpoint's replay state is not one mlm_adapt writes ({exc}); resume from "
                "an unaltered checkpoint, or start the run again"
            ) from None
        self.controlled_rate = None if rate is None else min(float(rate), self.max_rate)
        self.baseline = None if baseline is None else float(baseline)
        self.checks = checks


def replay_summary(state: Any) -> dict[str, Any]:
    """What a run's replay did, from a :meth:`Replay.state_dict` (also read back from a checkpoint): ``{}``
    without a budget's checks, else ``budget``, ``trajectory`` (``[step, rate, rise]`` where the rate changed,
    and the first and last), ``final_rate``, ``mean_rate``, ``last_rise`` and ``held`` (within the budget)."""
    state = state if isinstance(state, dict) else {}
    checks, baseline, budget = state.get("checks") or [], state.get("baseline"), state.get("budget")
    if not checks or not baseline or budget is None:
        return {}
    points = [(int(s), float(r), float(p) / baseline - 1) for s, p, r in checks]
    trajectory = [p for i, p in enumerate(points) if i in (0, len(points) - 1) or p[1] != points[i - 1][1]]
    spans = [(b[0] - a[0], a[1]) for a, b in zip(points, points[1:], strict=False)]
    total = sum(n for n, _ in spans)
    return {
        "budget": budget,
        "trajectory": [[s, round(r, 4), round(x, 4)] for s, r, x in trajectory],
        "final_rate": points[-1][1],
        "mean_rate": sum(n * r for n, r in spans) / total if total else points[-1][1],
        "last_rise": points[-1][2],
        "held": points[-1][2] <= budget,
    }


def describe_replay(summary: dict[str, Any]) -> str:
    """One line: ``mix rate 0 (step 0) -> 0.1 (step 20) -> ...; mean 0.12; general +14% ...``."""
    steps = " -> ".join(f"{r:g} (step {s})" for s, r, _ in summary["trajectory"])
    budget = summary["budget"]
    held = "held" if summary["held"] else "exceeded"
    return (
        f"mix rate {steps}; mean {summary['mean_rate']:.3f}; general perplexity {summary['last_rise']:+.1%} "
        f"over step 0 at the last check (budget +{budget:.0%}: {held})"
    )
