"""README.md, docs/*.md and docstrings stay true: every repository path and dotted mlm_adapt name they
give exists (docs go stale silently)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from conftest import REPO
from jsonargparse import ArgumentError

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A repository path: one of the top-level folders, then path characters; not part of a longer path.
REPO_PATH = re.compile(r"(?<![\w./-])((?:mlm_adapt|scripts|configs|docs|tests|docker)/[\w./-]*)")
# A Markdown link target that is no URL and no in-page anchor, resolved against the document's folder.
LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s]+)\)")
# Names that stand for something (``mlm_adapt/cli/<name>.py``) or patterns (``reviews/*.txt``) are no paths.
PLACEHOLDER = re.compile(r"[<>*{}]|\.\.\.|…")
YAML_BLOCK = re.compile(r"^```ya?ml\n(.*?)^```", re.MULTILINE | re.DOTALL)
ARCHITECTURE = REPO / "docs" / "architecture.md"
MODULE_PATH = re.compile(r"(?<![\w./-])(mlm_adapt/[\w/]*\.py)\b")
DOTTED_MODULE = re.compile(r"(?<![\w.])(mlm_adapt(?:\.\w+)+)")


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


def test_architecture_names_every_module_and_only_real_ones():
    """docs/architecture.md is the map: each module by its repository path, so a new module or a rename
    is caught here (its dotted names are checked with every document's)."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    modules = {path.relative_to(REPO).as_posix() for path in (REPO / "mlm_adapt").rglob("*.py")}
    named = set(MODULE_PATH.findall(text))
    assert not modules - named, f"docs/architecture.md does not name {sorted(modules - named)}"
    stale = sorted(named - modules)
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"


def real_module_prefix(dotted: str) -> bool:
    """Whether ``mlm_adapt.a.b.c`` is a module, or names that a module holds (``mlm_adapt.a.b.Class``)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError:  # the rest may be names inside a shorter prefix
            continue
        for name in parts[end:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


SOURCES = [*DOCUMENTS, *sorted((REPO / "mlm_adapt").rglob("*.py")), *sorted((REPO / "scripts").rglob("*.py"))]


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.relative_to(REPO).as_posix())
def test_every_dotted_name_resolves(source):
    """A ``mlm_adapt.a.b`` named in a document, a docstring or a comment is a real module or a name in one:
    after a module is merged into another, references to the old one are found here, not by a reader."""
    names = set(DOTTED_MODULE.findall(source.read_text(encoding="utf-8")))
    unknown = sorted(name for name in names if not real_module_prefix(name))
    assert not unknown, f"{source.relative_to(REPO)} names what mlm_adapt does not hold: {unknown}"


def yaml_snippets() -> list[tuple[str, str]]:
    """``(document:line, text)`` of every fenced YAML block of the documents."""
    found = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        for match in YAML_BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{document.relative_to(REPO).as_posix()}:{line}", match.group(1)))
    return found


@pytest.fixture(scope="module")
def config_parser():
    """The fit command's parser as the CLI builds it, without building the model, data or trainer."""
    from mlm_adapt.cli.fit import MLMAdaptCLI

    class ParseOnly(MLMAdaptCLI):
        def before_instantiate_classes(self) -> None:
            pass

        def instantiate_classes(self) -> None:
            pass

    return ParseOnly(args=["--model.model_name_or_path=model"], run=False).parser


@pytest.mark.parametrize("snippet", [pytest.param(text, id=where) for where, text in yaml_snippets()])
def test_yaml_snippets_parse(snippet, config_parser, tmp_path):
    """A snippet a user pastes into a config is valid for the parser: its keys exist, its values check."""
    config = tmp_path / "snippet.yaml"
    config.write_text(snippet, encoding="utf-8")
    config_parser.parse_args(["--model.model_name_or_path=model", "--config", str(config)])


def test_a_snippet_with_an_unknown_key_is_refused(config_parser, tmp_path):
    config = tmp_path / "snippet.yaml"
    config.write_text("data:\n  segmentr: rjieba\n", encoding="utf-8")
    with pytest.raises(ArgumentError, match="segmentr"):
        config_parser.parse_args(["--model.model_name_or_path=model", "--config", str(config)])


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
