"""Downstream task configuration (the ``downstream.tasks`` YAML entries) and loading of their labelled files.

Files are read by the corpus loader's rules (jsonl/json/csv/parquet, globs, one-line errors naming the file
and the config key ``downstream.tasks[i].<key>``); the labels are checked before any model sees them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import datasets

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.corpus import BUILDERS, empty_file_error, encoding_error, expand_files

TaskType = Literal["sequence_classification", "token_classification"]
# Task names become metric names (downstream/<name>/f1), log lines and model-card table cells.
TASK_NAME = re.compile(r"[\w.\-]{1,64}")
# Tags entity-level F1 understands (BIO/IOB2): anything else would score 0 without a word.
BIO_TAG = re.compile(r"O|[BI]-.+")


@dataclass
class DownstreamTask:
    """One labelled task evaluated during adaptation.

    Args:
        name: Short name; metrics are logged as ``downstream/<name>/<metric>``.
        train_files: Files (or globs) the probe or fine-tune learns from.
        test_files: Files (or globs) the task is scored on.
        type: ``sequence_classification`` (one label per text or text pair) or ``token_classification``
            (one BIO tag per word, e.g. NER; scored by entity-level F1).
        text_column: Text column (sequence classification).
        text_pair_column: Second text column for sentence-pair tasks (e.g. NLI), or none.
        label_column: Label column (sequence classification); strings or integers.
        tokens_column: Column holding each example's words as a list (token classification).
        tags_column: Column holding one tag per word (token classification), e.g. ``B-PER``/``I-PER``/``O``.
    """

    name: str
    train_files: list[str]
    test_files: list[str]
    type: TaskType = "sequence_classification"
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    tokens_column: str = "tokens"
    tags_column: str = "tags"


@dataclass
class TaskSplit:
    """One split of a loaded task. ``texts``/``pairs`` for sequence tasks, ``words`` for token tasks;
    ``labels`` holds class indices (one per example, or one list per example for token tasks)."""

    texts: list[str] = field(default_factory=list)
    pairs: list[str] | None = None
    words: list[list[str]] = field(default_factory=list)
    labels: list[Any] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class LoadedTask:
    """A task with its label names and both splits."""

    task: DownstreamTask
    label_names: list[str]
    train: TaskSplit
    test: TaskSplit


def _key(index: int, name: str) -> str:
    return f"downstream.tasks[{index}].{name}"


def parse_task(entry: DownstreamTask | dict[str, Any], index: int) -> DownstreamTask:
    """A task from its YAML mapping, with one-line errors for missing or unknown keys."""
    if isinstance(entry, DownstreamTask):
        return entry
    if not isinstance(entry, dict):
        raise MLMAdaptError(f"downstream.tasks[{index}]: expected a mapping with name/train_files/test_files")
    known = set(DownstreamTask.__dataclass_fields__)
    unknown = sorted(set(entry) - known)
    if unknown:
        raise MLMAdaptError(f"{_key(index, unknown[0])}: unknown key; use {', '.join(sorted(known))}")
    for required in ("name", "train_files", "test_files"):
        if not entry.get(required):
            raise MLMAdaptError(f"{_key(index, required)} is required")
    task = DownstreamTask(**entry)
    if task.type not in ("sequence_classification", "token_classification"):
        raise MLMAdaptError(
            f"{_key(index, 'type')}: {task.type!r}; use sequence_classification or token_classification"
        )
    if not isinstance(task.name, str) or not TASK_NAME.fullmatch(task.name):
        raise MLMAdaptError(
            f"{_key(index, 'name')}: {task.name!r} cannot name metrics, log lines and model-card rows; use "
            "letters, digits, '-', '_' or '.' (no spaces, '/', '|' or line breaks, at most 64 characters)"
        )
    for files in ("train_files", "test_files"):
        if isinstance(getattr(task, files), str):
            setattr(task, files, [getattr(task, files)])
    return task


def load_table(
    files: list[str], files_key: str, columns: dict[str, str], key_prefix: str, cache_dir: str | None = None
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
            part = datasets.load_dataset(builder, data_files=group, split="train", cache_dir=cache_dir)
        except Exception as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise MLMAdaptError(
                f"{files_key}: could not read {', '.join(group)} as {builder}: {reason}"
            ) from exc
        for key, column in columns.items():
            if column not in part.column_names:
                raise MLMAdaptError(
                    f"{key_prefix}{key}: column {column!r} not found in {', '.join(group)} "
                    f"(columns: {', '.join(part.column_names)})"
                )
        parts.append(part.select_columns(list(dict.fromkeys(columns.values()))))
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def _as_label(value: Any, key: str, files: list[str]) -> str:
    if value is None or isinstance(value, (list, dict)):
        raise MLMAdaptError(f"{key}: label {value!r} in {', '.join(files)} is not a class name or number")
    return str(value)


def _load_split(
    task: DownstreamTask, index: int, split: str, cache_dir: str | None
) -> tuple[TaskSplit, list]:
    files_key = _key(index, f"{split}_files")
    files = expand_files(task.__dict__[f"{split}_files"], files_key)
    if task.type == "sequence_classification":
        columns = {
            "text_column": task.text_column,
            "text_pair_column": task.text_pair_column,
            "label_column": task.label_column,
        }
    else:
        columns = {"tokens_column": task.tokens_column, "tags_column": task.tags_column}
    wanted = {k: v for k, v in columns.items() if v}
    table = load_table(files, files_key, wanted, f"downstream.tasks[{index}].", cache_dir)
    if len(table) == 0:
        raise MLMAdaptError(f"{files_key}: {', '.join(files)} holds no examples")
    out = TaskSplit()
    if task.type == "sequence_classification":
        for col in ("text_column", "text_pair_column"):
            name = columns[col]
            if name and not all(isinstance(t, str) for t in table[name]):
                raise MLMAdaptError(
                    f"{_key(index, col)}: column {name!r} of {', '.join(files)} holds non-text values"
                )
        out.texts = list(table[task.text_column])
        out.pairs = list(table[task.text_pair_column]) if task.text_pair_column else None
        raw = [_as_label(v, _key(index, "label_column"), files) for v in table[task.label_column]]
        return out, raw
    raw_tags = []
    for row, (words, tags) in enumerate(zip(table[task.tokens_column], table[task.tags_column], strict=True)):
        if not isinstance(words, list) or not isinstance(tags, list):
            raise MLMAdaptError(
                f"{_key(index, 'tokens_column')}: example {row} of {', '.join(files)}: "
                f"{task.tokens_column!r} and {task.tags_column!r} must be lists (one tag per word)"
            )
        if len(words) != len(tags):
            raise MLMAdaptError(
                f"{_key(index, 'tags_column')}: example {row} of {', '.join(files)} has {len(words)} "
                f"{task.tokens_column} but {len(tags)} {task.tags_column}; give one tag per word"
            )
        out.words.append([str(w) for w in words])
        raw_tags.append([_as_label(t, _key(index, "tags_column"), files) for t in tags])
    return out, raw_tags


def _check_bio(tags: list[str], key: str, files: list[str]) -> None:
    wrong = [t for t in tags if not BIO_TAG.fullmatch(t)]
    if wrong:
        raise MLMAdaptError(
            f"{key}: tag {wrong[0]!r} in {', '.join(files)} is not BIO (O, B-TYPE, I-TYPE), so entity F1 "
            "would be 0; convert the tags (BIOES: S- to B-, E- to I-; IO: TYPE to I-TYPE)"
        )


def load_task(entry: DownstreamTask | dict[str, Any], index: int, cache_dir: str | None = None) -> LoadedTask:
    """Loads and checks both splits of task ``index`` (its position in ``downstream.tasks``).

    Raises:
        MLMAdaptError: A file is missing or unreadable, a column is unknown, words and tags differ in
            length, the training labels have one class only, or the test split has a label the training
            split lacks.
    """
    task = parse_task(entry, index)
    train, train_raw = _load_split(task, index, "train", cache_dir)
    test, test_raw = _load_split(task, index, "test", cache_dir)
    token_task = task.type == "token_classification"
    flat_train = [t for tags in train_raw for t in tags] if token_task else train_raw
    flat_test = [t for tags in test_raw for t in tags] if token_task else test_raw
    label_key = _key(index, "tags_column" if token_task else "label_column")
    names = sorted(set(flat_train))
    if len(names) < 2:
        raise MLMAdaptError(
            f"{label_key}: the training files {', '.join(task.train_files)} have one label only "
            f"({names[0]!r}); a task needs at least two classes"
        )
    unseen = sorted(set(flat_test) - set(names))
    if unseen:
        raise MLMAdaptError(
            f"{label_key}: test label {unseen[0]!r} never occurs in the training files; "
            "add training examples for it or drop it from the test files"
        )
    if token_task:
        _check_bio(names + unseen, label_key, task.train_files + task.test_files)
    if token_task and "O" in names:  # the "outside" tag first: index 0 is what unlabelled words get
        names.remove("O")
        names.insert(0, "O")
    index_of = {n: i for i, n in enumerate(names)}
    for split, raw in ((train, train_raw), (test, test_raw)):
        split.labels = (
            [[index_of[t] for t in tags] for tags in raw] if token_task else [index_of[v] for v in raw]
        )
    return LoadedTask(task=task, label_names=names, train=train, test=test)
