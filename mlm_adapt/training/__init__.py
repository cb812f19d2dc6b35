"""Callbacks that make a run exact, resumable and readable; :func:`default_callbacks` lists the ones the
CLI always adds, in their order."""

from mlm_adapt.training.callbacks import (
    BeforeAfterValidation,
    ForgettingBudget,
    ForgettingWarning,
    GlobalBatchInfo,
    default_callbacks,
    forgotten_sets,
)
from mlm_adapt.training.exact_resume import ExactResume
from mlm_adapt.training.resume import ResumeMatch
from mlm_adapt.training.signals import StopOnSignal

__all__ = [
    "BeforeAfterValidation",
    "ExactResume",
    "ForgettingBudget",
    "ForgettingWarning",
    "GlobalBatchInfo",
    "ResumeMatch",
    "StopOnSignal",
    "default_callbacks",
    "forgotten_sets",
]
