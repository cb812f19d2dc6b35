"""Downstream evaluation during adaptation: linear probes and short fine-tunes on labelled tasks."""

from mlm_adapt.downstream.callback import DownstreamEvaluation
from mlm_adapt.downstream.evaluate import TaskEvaluator
from mlm_adapt.downstream.tasks import LoadedTask, load_task
from mlm_adapt.downstream.types import TASK_TYPES, TaskType
from mlm_adapt.downstream.types.base import DownstreamTask

__all__ = [
    "TASK_TYPES",
    "DownstreamEvaluation",
    "DownstreamTask",
    "LoadedTask",
    "TaskEvaluator",
    "TaskType",
    "load_task",
]
