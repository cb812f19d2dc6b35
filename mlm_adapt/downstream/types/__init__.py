"""Downstream task types: one module each behind :class:`~mlm_adapt.downstream.types.base.TaskType`.

A new type is one module (a ``TaskType`` subclass) plus one line in ``TASK_TYPES`` below.
"""

from __future__ import annotations

from mlm_adapt.downstream.spec import task_key
from mlm_adapt.downstream.types.base import TaskType
from mlm_adapt.downstream.types.pair import PairClassification
from mlm_adapt.downstream.types.regression import Regression
from mlm_adapt.downstream.types.sequence import SequenceClassification
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
