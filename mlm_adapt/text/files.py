"""Corpus paths: which files a ``data.*_files`` value names (paths and globs, checked one by one) and the
suffixes a corpus file may have; light (no ``datasets``), so that a command refuses a missing file at once."""

from __future__ import annotations

import glob
from pathlib import Path

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
    """Expands paths and globs (``patterns``, from the config key ``key``) in order, failing on any that
    matches nothing. A file that exists is that file, even if its name reads as a glob
    (``reviews[2023].txt``)."""
    if isinstance(patterns, str):
        patterns = [patterns]
    files: list[str] = []
    for pattern in patterns:
        path = Path(pattern).expanduser()
        if path.is_dir():
            raise MLMAdaptError(
                f"{key}: {pattern} is a directory; give its files or a glob, e.g. {Path(pattern) / '*.txt'}"
            )
        matches = [str(path)] if path.is_file() else sorted(glob.glob(str(path), recursive=True))
        if matches and not any(Path(m).is_file() for m in matches):
            raise MLMAdaptError(f"{key}: {pattern!r} matches only directories; give a glob of files")
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


def data_files(files: list[str]) -> list[str]:
    """``files`` (expanded paths) as ``datasets.load_dataset``'s ``data_files``, which it reads as globs:
    escaped, so that ``reviews[2023].txt`` is that file and not ``reviews2.txt``."""
    return [glob.escape(file) for file in files]
