"""Downstream task types behind :class:`~mlm_adapt.downstream.types.base.TaskType`: a new type is a
``TaskType`` subclass (one module) plus one line in ``TASK_TYPES`` below."""

from __future__ import annotations

from mlm_adapt.downstream.types.base import TaskType, task_key
from mlm_adapt.downstream.types.sequence import PairClassification, Regression, SequenceClassification
from mlm_adapt.downstream.types.token import TokenClassification
from mlm_adapt.errors import MLMAdaptError

TASK_TYPES: dict[str, TaskType] = {
    kind.name: kind
    for kind in (SequenceClassification(), PairClassification(), TokenClassification(), Regression())
}


def task_type(name: str, index: int) -> TaskType:
    """The registered type called ``name`` (one-line error naming the choices otherwise)."""
    if name not in TASK_TYPES:
        raise MLMAdaptError(f"{task_key(index, 'type')}: {name!r}; use {', '.join(TASK_TYPES)}")
    return TASK_TYPES[name]


__all__ = ["TASK_TYPES", "TaskType", "task_type"]
