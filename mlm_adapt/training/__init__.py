"""Training: exact resume, the run's scale summary and the before/after validation, as Lightning callbacks."""

from __future__ import annotations

import lightning as L

from mlm_adapt.training.baseline import BeforeAfterValidation
from mlm_adapt.training.forgetting import ForgettingBudget, ForgettingWarning
from mlm_adapt.training.resume import ExactResume
from mlm_adapt.training.scale import GlobalBatchInfo
from mlm_adapt.training.signals import StopOnSignal


def default_callbacks() -> list[L.Callback]:
    """Callbacks the CLI always adds (persistent ``trainer_defaults``): before/after, resume, scale and the
    forgetting warning and budget (active when ``data.forgetting_warning``/``data.forgetting_budget`` are
    set), and the checkpoint on SIGTERM.

    ``BeforeAfterValidation`` comes before ``ExactResume``: its step-0 validation runs in the first
    ``on_train_batch_start``, and ExactResume's reseeding after it keeps dropout independent of it.
    """
    return [
        BeforeAfterValidation(),
        ExactResume(),
        GlobalBatchInfo(),
        ForgettingWarning(),
        ForgettingBudget(),
        StopOnSignal(),
    ]


__all__ = [
    "BeforeAfterValidation",
    "ExactResume",
    "ForgettingBudget",
    "ForgettingWarning",
    "GlobalBatchInfo",
    "StopOnSignal",
    "default_callbacks",
]
