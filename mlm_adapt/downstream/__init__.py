"""Downstream evaluation during adaptation: linear probes and short fine-tunes on labelled tasks."""

from mlm_adapt.downstream.callback import DownstreamEvaluation
from mlm_adapt.downstream.evaluate import TaskEvaluator
from mlm_adapt.downstream.tasks import DownstreamTask, LoadedTask, load_task

__all__ = ["DownstreamEvaluation", "DownstreamTask", "LoadedTask", "TaskEvaluator", "load_task"]
