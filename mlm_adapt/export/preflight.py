"""What the export needs that can be checked before training: the monitored metric and some training.

``export.monitor`` picks the weights to export; a name the run never logs used to surface as a warning
after training (the final weights exported instead). :func:`logged_metrics` lists what a run logs -- the
training loss, the four metrics of every validation set (``val/*``, ``val_<name>/*``) and the scores of
every downstream task (``downstream/<task>/<metric>`` and its ``_std``) -- and :func:`check_monitor`
refuses, with one line and the closest match, a name in those namespaces that the run does not log and
any name within a typo of a logged one (``vall/loss``); other names are metrics of the user's own
callbacks (``custom/score``) and pass. A run that trains no step (``max_steps 0``,
``max_epochs 0``, ``limit_train_batches 0``) is refused by :func:`check_trains`: its export would be the
base model's weights under the name of an adapted model (to score the base model, run ``validate``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any

import lightning as L

from mlm_adapt.downstream import DownstreamEvaluation
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.model.metrics import EVAL_METRICS, SPREAD_SUFFIX, validation_prefix

TASK_METRICS = {
    "sequence_classification": ("accuracy", "macro_f1"),
    "token_classification": ("f1", "accuracy"),
}
# Metric namespaces of mlm_adapt itself: a name in them that the run does not log is a mistake.
OWN_PREFIXES = ("train/", "val/", "val_", "test/", "downstream/")
# A name at least this similar (difflib ratio) to a logged one is taken for a typo of it.
TYPO_SIMILARITY = 0.85
_EVAL_NAMES = tuple(name.partition("/")[2] for name in EVAL_METRICS)


def logged_metrics(validation_sets: Sequence[str], tasks: Iterable[tuple[str, str]]) -> list[str]:
    """Every metric name a fit logs that can pick the exported weights.

    Args:
        validation_sets: The validation sets' names, in order (``MLMDataModule.validation_set_names``).
        tasks: ``(name, type)`` of every downstream task.
    """
    names = ["train/loss"]
    for index in range(len(validation_sets)):
        prefix = validation_prefix(index, validation_sets)
        names += [f"{prefix}/{metric}" for metric in _EVAL_NAMES]
    for task, kind in tasks:
        for metric in TASK_METRICS.get(kind, ()):
            names += [f"downstream/{task}/{metric}", f"downstream/{task}/{metric}{SPREAD_SUFFIX}"]
    return names


def check_monitor(monitor: str, logged: Sequence[str], key: str = "export.monitor") -> None:
    """Refuses a ``monitor`` in mlm_adapt's namespaces (:data:`OWN_PREFIXES`) that is not among the
    ``logged`` names, and any name within a typo of one (one line, closest match). Other names are the
    metrics of the user's own callbacks and pass."""
    if monitor in logged:
        return
    close = difflib.get_close_matches(monitor, logged, n=1, cutoff=TYPO_SIMILARITY)
    if not monitor.startswith(OWN_PREFIXES) and not close:
        return
    close = close or difflib.get_close_matches(monitor, logged, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    shown = ", ".join(name for name in logged if not name.endswith(SPREAD_SUFFIX))
    raise MLMAdaptError(f"{key}={monitor!r} is not a metric this run logs; {hint}it logs: {shown}")


def run_metrics(trainer: L.Trainer) -> list[str]:
    """:func:`logged_metrics` of a trainer's fit: its datamodule's validation sets and downstream tasks."""
    sets = list(getattr(trainer.datamodule, "validation_set_names", None) or ["validation"])
    tasks = [
        (task.name, task.type)
        for callback in trainer.callbacks
        if isinstance(callback, DownstreamEvaluation)
        for task in callback.tasks
    ]
    return logged_metrics(sets, tasks)


def _zero(value: Any) -> bool:
    return value is not None and not isinstance(value, bool) and value == 0


def check_trains(trainer: L.Trainer, key: str = "export") -> None:
    """Refuses a fit that would train no step while it exports (see the module docstring)."""
    limits = {
        "trainer.max_steps": trainer.max_steps,
        "trainer.max_epochs": trainer.max_epochs,
        "trainer.limit_train_batches": trainer.limit_train_batches,
    }
    for name, value in limits.items():
        if _zero(value):
            raise MLMAdaptError(
                f"{name}={value} trains no step, so the {key} would be the base model's weights; "
                "set it above 0, or use `validate` to score the base model (or export.enabled=false)"
            )
