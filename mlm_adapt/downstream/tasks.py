"""Loading the labelled files of a ``downstream.tasks`` entry (jsonl/json/csv/parquet, globs, one-line errors
naming the file and the config key), checked by its type's rules before any model sees them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from mlm_adapt.downstream.types import TaskType, task_type
from mlm_adapt.downstream.types.base import DownstreamTask, TaskSplit, task_key
from mlm_adapt.errors import MLMAdaptError, exception_line, user_code
from mlm_adapt.text.corpus import empty_file_error, encoding_error
from mlm_adapt.text.files import BUILDERS, data_files, expand_files

# Task names become metric names (downstream/<name>/f1), log lines and model-card table cells.
TASK_NAME = re.compile(r"[\w.\-]{1,64}")


@dataclass
class LoadedTask:
    """A task with its type, label names (none for numeric targets) and both splits."""

    task: DownstreamTask
    kind: TaskType
    label_names: list[str]
    train: TaskSplit
    test: TaskSplit


def parse_task(entry: DownstreamTask | dict[str, Any], index: int) -> DownstreamTask:
    """A task from its YAML mapping, with one-line errors for missing or unknown keys and unknown types."""
    if isinstance(entry, DownstreamTask):
        task = entry
    elif not isinstance(entry, dict):
        raise MLMAdaptError(f"downstream.tasks[{index}]: expected a mapping with name/train_files/test_files")
    else:
        known = set(DownstreamTask.__dataclass_fields__)
        unknown = sorted(set(entry) - known)
        if unknown:
            raise MLMAdaptError(f"{task_key(index, unknown[0])}: unknown key; use {', '.join(sorted(known))}")
        for required in ("name", "train_files", "test_files"):
            if not entry.get(required):
                raise MLMAdaptError(f"{task_key(index, required)} is required")
        task = DownstreamTask(**entry)
    task_type(task.type, index).check(task, index)
    if not isinstance(task.name, str) or not TASK_NAME.fullmatch(task.name):
        raise MLMAdaptError(
            f"{task_key(index, 'name')}: {task.name!r} cannot name metrics, log lines and model-card rows; "
            "use letters, digits, '-', '_' or '.' (no spaces, '/', '|' or line breaks, at most 64 characters)"
        )
    for files in ("train_files", "test_files"):
        if isinstance(getattr(task, files), str):
            setattr(task, files, [getattr(task, files)])
    return task


def load_table(
    files: list[str], files_key: str, columns: dict[str, str], index: int, cache_dir: str | None = None
) -> datasets.Dataset:
    """Loads ``files`` (grouped by format, in order) keeping ``columns`` (``{config key: column}``) only."""
    by_builder: dict[str, list[str]] = {}
    for file in files:
        by_builder.setdefault(BUILDERS[Path(file).suffix.lower()], []).append(file)
    parts = []
    for builder, group in by_builder.items():
        if builder == "text":
            raise MLMAdaptError(
                f"{files_key}: {group[0]} is plain text; labelled data must be jsonl/json/csv/parquet"
            )
        empty = empty_file_error(group, files_key)
        if empty is not None:
            raise empty
        # arrow's JSON reader accepts invalid UTF-8 and fails later, unhelpfully; parquet is binary.
        for file in group if builder != "parquet" else []:
            error = encoding_error(file, files_key)
            if error is not None:
                raise error
        try:
            part = datasets.load_dataset(
                builder, data_files=data_files(group), split="train", cache_dir=cache_dir
            )
        except Exception as exc:
            raise MLMAdaptError(
                f"{files_key}: could not read {', '.join(group)} as {builder}: {exception_line(exc)}"
            ) from exc
        for key, column in columns.items():
            if column not in part.column_names:
                raise MLMAdaptError(
                    f"{task_key(index, key)}: column {column!r} not found in {', '.join(group)} "
                    f"(columns: {', '.join(part.column_names)})"
                )
        parts.append(part.select_columns(list(dict.fromkeys(columns.values()))))
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


READER_HINT = "fix the task type or its files (rerun with --debug for the traceback)"


def _reader(kind: TaskType, index: int, method: str) -> str:
    """The task type's method, as messages name it (a registered type may be the user's code)."""
    cls = type(kind)
    return f"{task_key(index, 'type')}: {kind.name} ({cls.__module__}.{cls.__qualname__}.{method})"


def _load_split(
    task: DownstreamTask, kind: TaskType, index: int, split: str, cache_dir: str | None
) -> tuple[TaskSplit, list]:
    files_key = task_key(index, f"{split}_files")
    files = expand_files(getattr(task, f"{split}_files"), files_key)
    table = load_table(files, files_key, kind.columns(task), index, cache_dir)
    if len(table) == 0:
        raise MLMAdaptError(f"{files_key}: {', '.join(files)} holds no examples")
    with user_code(_reader(kind, index, "read"), READER_HINT):
        return kind.read(table, task, index, ", ".join(files))


def load_task(entry: DownstreamTask | dict[str, Any], index: int, cache_dir: str | None = None) -> LoadedTask:
    """Loads and checks both splits of task ``index`` (its position in ``downstream.tasks``); one-line
    ``MLMAdaptError`` for a missing or unreadable file, an unknown column, or labels unfit for the type."""
    task = parse_task(entry, index)
    kind = task_type(task.type, index)
    train, train_raw = _load_split(task, kind, index, "train", cache_dir)
    test, test_raw = _load_split(task, kind, index, "test", cache_dir)
    with user_code(_reader(kind, index, "targets"), READER_HINT):
        names, train.labels, test.labels = kind.targets(train_raw, test_raw, index, task)
    return LoadedTask(task=task, kind=kind, label_names=names, train=train, test=test)
