"""Issue 19: every repository path that README.md and docs/*.md name exists (docs go stale silently)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A repository path: one of the top-level folders, then path characters; not part of a longer path.
REPO_PATH = re.compile(r"(?<![\w./-])((?:mlm_adapt|scripts|configs|docs|tests|docker)/[\w./-]*)")
# A Markdown link target that is no URL and no in-page anchor, resolved against the document's folder.
LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s]+)\)")
# Names that stand for something (``mlm_adapt/cli/<name>.py``) or patterns (``reviews/*.txt``) are no paths.
PLACEHOLDER = re.compile(r"[<>*{}]|\.\.\.|…")


def named_paths(document: Path) -> set[tuple[str, Path]]:
    """``(as written, resolved path)`` of every repository path and local link in ``document``."""
    text = document.read_text(encoding="utf-8")
    found = set()
    for match in REPO_PATH.finditer(text):
        end = match.end()
        if PLACEHOLDER.search(text[end : end + 1]):
            continue  # `mlm_adapt/cli/<name>.py`: the path goes on with a placeholder
        written = match.group(1).rstrip(".,:;")
        found.add((written, REPO / written))
    for match in LINK.finditer(text):
        written = match.group(1).split("#")[0]
        if written:
            found.add((written, (document.parent / written).resolve()))
    return {(written, path) for written, path in found if not PLACEHOLDER.search(written)}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.relative_to(REPO).as_posix())
def test_every_named_path_exists(document):
    missing = sorted(written for written, path in named_paths(document) if not path.exists())
    assert not missing, f"{document.relative_to(REPO)} names paths that do not exist: {missing}"


def test_the_check_finds_paths_and_links(tmp_path):
    document = tmp_path / "doc.md"
    document.write_text(
        "See `mlm_adapt/text/segmentation.py`, tests/test_docs.py, [results](results.md#table), "
        "`mlm_adapt/cli/<name>.py`, `.cache/demo/reviews/*.txt` and https://example.org/docs/x.md.\n",
        encoding="utf-8",
    )
    assert {written for written, _ in named_paths(document)} == {
        "mlm_adapt/text/segmentation.py",
        "tests/test_docs.py",
        "results.md",
    }
