"""Loading raw corpora (local files or Hub datasets) into a ``datasets.Dataset`` with one ``text`` column."""

from __future__ import annotations

import glob
from pathlib import Path

import datasets

from mlm_adapt.errors import MLMAdaptError

# File suffix -> datasets packaged builder.
BUILDERS = {
    ".txt": "text",
    ".text": "text",
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
}


def expand_files(patterns: list[str] | str, key: str) -> list[str]:
    """Expands paths and globs in order, failing on any that matches nothing.

    Args:
        patterns: Paths or glob patterns.
        key: The config key they came from, for the error message.
    """
    if isinstance(patterns, str):
        patterns = [patterns]
    files: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(str(Path(pattern).expanduser()), recursive=True))
        matches = [m for m in matches if Path(m).is_file()]
        if not matches:
            raise MLMAdaptError(f"{key}: {pattern!r} matches no file; check the path or glob")
        for match in matches:
            if Path(match).suffix.lower() not in BUILDERS:
                raise MLMAdaptError(
                    f"{key}: {match} has an unsupported extension; use one of {', '.join(sorted(BUILDERS))}"
                )
        files.extend(m for m in matches if m not in files)
    return files


def find_non_utf8_line(path: str) -> int | None:
    """1-based number of the first line of ``path`` that is not valid UTF-8, or ``None``."""
    with open(path, "rb") as handle:
        for lineno, line in enumerate(handle, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return lineno
    return None


def text_only(dataset: datasets.Dataset, text_column: str) -> datasets.Dataset:
    """Keeps only ``text_column``, renamed ``text`` (works for ``Dataset`` and ``IterableDataset``)."""
    dataset = dataset.select_columns([text_column])
    return dataset if text_column == "text" else dataset.rename_column(text_column, "text")


def _load_one_builder(builder: str, files: list[str], key: str, text_column: str, cache_dir: str | None):
    try:
        dataset = datasets.load_dataset(builder, data_files=files, split="train", cache_dir=cache_dir)
    except Exception as exc:  # datasets wraps decode errors in its own generation errors
        for file in files:
            lineno = find_non_utf8_line(file)
            if lineno is not None:
                raise MLMAdaptError(
                    f"{key}: {file} line {lineno} is not UTF-8; convert it, e.g. "
                    f"iconv -f GB18030 -t UTF-8 {file} > {Path(file).stem}.utf8{Path(file).suffix}"
                ) from None
        raise MLMAdaptError(f"{key}: could not read {', '.join(files)} as {builder}: {exc}") from exc
    if text_column not in dataset.column_names:
        raise MLMAdaptError(
            f"{key}: column {text_column!r} not found in {', '.join(files)} (columns: "
            f"{', '.join(dataset.column_names)}); set data.text_column"
        )
    return text_only(dataset, text_column)


def load_files(
    files: list[str], key: str, text_column: str, cache_dir: str | None = None
) -> datasets.Dataset:
    """Loads local files (grouped by format) into one dataset with a ``text`` column, in file order."""
    by_builder: dict[str, list[str]] = {}
    for file in files:
        by_builder.setdefault(BUILDERS[Path(file).suffix.lower()], []).append(file)
    parts = [_load_one_builder(b, fs, key, text_column, cache_dir) for b, fs in by_builder.items()]
    for i, part in enumerate(parts):
        # csv/json may infer non-string types (e.g. a numeric column); text must be a string.
        dtype = getattr(part.features["text"], "dtype", None)
        if dtype not in ("string", "large_string"):
            raise MLMAdaptError(f"{key}: column {text_column!r} is not text; set data.text_column")
        if dtype == "large_string":  # pandas-written parquet; concatenation needs one string type
            parts[i] = part.cast_column("text", datasets.Value("string"))
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def load_hub(
    name: str, config: str | None, split: str, text_column: str, cache_dir: str | None
) -> datasets.Dataset:
    """Loads one split of a dataset through ``datasets.load_dataset`` (Hub name or local dataset dir)."""
    try:
        dataset = datasets.load_dataset(name, config, split=split, cache_dir=cache_dir)
    except Exception as exc:
        raise MLMAdaptError(f"data.dataset_name: could not load {name!r} split {split!r}: {exc}") from exc
    if text_column not in dataset.column_names:
        raise MLMAdaptError(
            f"data.text_column: {text_column!r} not in {name} (columns: {', '.join(dataset.column_names)})"
        )
    return text_only(dataset, text_column)
