"""Loading raw corpora (local files or Hub datasets) into a ``datasets.Dataset`` with one ``text`` column."""

from __future__ import annotations

import codecs
import json
from pathlib import Path

import datasets

from mlm_adapt.errors import MLMAdaptError, exception_line
from mlm_adapt.text.files import BUILDERS, data_files


def encoding_error(path: str, key: str) -> MLMAdaptError | None:
    """The one-line error for a file that is not UTF-8 text, with the fix for what it is; ``None`` if it is.

    UTF-16 (a byte-order mark) and binary files (NUL bytes) are told apart from a line in another Chinese
    encoding; the ``iconv -f GB18030`` hint is given only when that line does decode as GB18030.
    """
    converted = f"{Path(path).stem}.utf8{Path(path).suffix}"
    with open(path, "rb") as handle:
        head = handle.read(8192)
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return MLMAdaptError(
            f"{key}: {path} is UTF-16 (it starts with a byte-order mark); convert it, e.g. "
            f"iconv -f UTF-16 -t UTF-8 {path} > {converted}"
        )
    if b"\x00" in head:
        return MLMAdaptError(f"{key}: {path} is not a text file (it holds NUL bytes); give UTF-8 text files")
    with open(path, "rb") as handle:
        bad = next(((n, line) for n, line in enumerate(handle, start=1) if not _decodes(line, "utf-8")), None)
    if bad is None:
        return None
    lineno, line = bad
    if _decodes(line, "gb18030"):
        hint = f"convert it, e.g. iconv -f GB18030 -t UTF-8 {path} > {converted}"
    else:
        hint = f"find its encoding (e.g. file -i {path}) and convert it with iconv -f ENCODING -t UTF-8"
    return MLMAdaptError(f"{key}: {path} line {lineno} is not UTF-8; {hint}")


def _decodes(line: bytes, encoding: str) -> bool:
    try:
        line.decode(encoding)
    except UnicodeDecodeError:
        return False
    return True


def json_error(path: str, key: str) -> MLMAdaptError | None:
    """The one-line error naming the first malformed line of a JSON Lines (or JSON) file, if any."""
    text = Path(path).read_text(encoding="utf-8")
    if not path.lower().endswith(".jsonl"):
        try:
            json.loads(text)
            return None  # one JSON document
        except json.JSONDecodeError as exc:
            if exc.msg != "Extra data":  # else several documents: JSON Lines, checked line by line below
                return MLMAdaptError(
                    f"{key}: {path} line {exc.lineno} is not valid JSON ({exc.msg}, column {exc.colno})"
                )
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            json.loads(line)
        except json.JSONDecodeError as exc:
            return MLMAdaptError(
                f"{key}: {path} line {lineno} is not valid JSON ({exc.msg}, column {exc.colno}); "
                "JSON Lines files hold one object per line"
            )
    return None


def file_error(files: list[str], key: str) -> MLMAdaptError | None:
    """Why ``datasets`` could not read ``files`` (it names neither the file nor the line): the first
    not-UTF-8 or malformed JSON line, if any. Called after a read failed: the scan reads the files once."""
    for file in files:
        error = encoding_error(file, key)
        if error is None and BUILDERS.get(Path(file).suffix.lower()) == "json":
            error = json_error(file, key)
        if error is not None:
            return error
    return None


# Files up to this size are read to tell a whitespace-only file from one with content.
_SMALL_FILE = 1 << 16
# ``datasets``' text builder reads 10 M characters per chunk (~30 MB of Chinese UTF-8) and holds two
# chunks at once as Python strings and Arrow: ~250 MiB for a 100 MB corpus. A 1 M-character chunk keeps
# loading's memory flat from a few MB of text on, at no measurable cost in speed.
TEXT_CHUNK_CHARACTERS = 1 << 20


def builder_options(builder: str) -> dict[str, int]:
    """Extra ``load_dataset`` arguments for a builder (in-memory and streaming alike): the text chunk size."""
    return {"chunksize": TEXT_CHUNK_CHARACTERS} if builder == "text" else {}


def empty_file_error(files: list[str], key: str) -> MLMAdaptError | None:
    """The one-line error for the first of ``files`` that is empty (or holds only whitespace), if any:
    ``datasets`` reports such a file as a generation error, or with an empty reason."""
    for file in files:
        size = Path(file).stat().st_size
        if size == 0 or (size <= _SMALL_FILE and not Path(file).read_bytes().strip()):
            return MLMAdaptError(f"{key}: {file} is empty; give a file that holds data (or drop it)")
    return None


def text_only(dataset: datasets.Dataset, text_column: str) -> datasets.Dataset:
    """Keeps only ``text_column``, renamed ``text`` (works for ``Dataset`` and ``IterableDataset``)."""
    dataset = dataset.select_columns([text_column])
    return dataset if text_column == "text" else dataset.rename_column(text_column, "text")


def _load_one_builder(builder: str, files: list[str], key: str, text_column: str, cache_dir: str | None):
    empty = empty_file_error(files, key)
    if empty is not None:
        raise empty
    try:
        dataset = datasets.load_dataset(
            builder,
            data_files=data_files(files),
            split="train",
            cache_dir=cache_dir,
            **builder_options(builder),
        )
    except Exception as exc:  # datasets wraps decode and parse errors in its own generation errors
        error = file_error(files, key)
        if error is not None:
            raise error from None
        raise MLMAdaptError(
            f"{key}: could not read {', '.join(files)} as {builder}: {exception_line(exc)}"
        ) from exc
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
    for i, (part, part_files) in enumerate(zip(parts, by_builder.values(), strict=True)):
        # csv/json may infer non-string types (e.g. a numeric column); text must be a string.
        dtype = getattr(part.features["text"], "dtype", None)
        if dtype not in ("string", "large_string"):
            example = part[0]["text"] if len(part) else None
            raise MLMAdaptError(
                f"{key}: column {text_column!r} of {', '.join(part_files)} holds {dtype or 'non-text'} "
                f"values (e.g. {example!r}), not text; quote the values in the file (or point "
                "data.text_column at the column that holds the text)"
            )
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
