"""The package's layers: each imports only the layers before it, with no cycles and no hidden imports.

Imports sit at the top of a module, except in the command line (``cli``), which imports a command's stack
when the command runs (so ``--help`` answers at once); those imports obey the layers too. A package's lazy
exports (``_EXPORTS``: name -> module) count as its imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mlm_adapt"
# The data flow, first to last; a module may import its own layer and those before it.
LAYERS = (
    "lazy_exports",
    "errors",
    "options",
    "guard",
    "text",
    "masking",
    "data",
    "model",
    "downstream",
    "training",
    "export",
    "cli",
)


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "mlm_adapt":
        return None
    return "cli" if parts[1] == "__main__" else parts[1]


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _own_imports(path: Path) -> list[tuple[str, int, bool]]:
    """``(module, line, at top level)`` of every import of an ``mlm_adapt`` module in ``path``, the modules
    of its lazy exports included (at top level)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Assign) and id(node) in top and ast.unparse(node.targets[0]) == "_EXPORTS":
            names = [value.value for value in node.value.values]  # type: ignore[attr-defined]
        found += [(n, node.lineno, id(node) in top) for n in names if n.split(".")[0] == "mlm_adapt"]
    return found


@pytest.mark.parametrize("module", sorted(_modules()))
def test_module_imports_only_earlier_layers_at_top_level(module):
    path = _modules()[module]
    own = _layer(module)
    for imported, line, at_top in _own_imports(path):
        where = f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}"
        assert at_top or own == "cli", f"{where} inside a function or block; import it at the top"
        target = _layer(imported)
        if own is None or target is None:  # mlm_adapt/__init__.py re-exports the public names
            continue
        assert LAYERS.index(target) <= LAYERS.index(own), f"{where}: {own} may not import {target}"


def test_no_import_cycles():
    modules = _modules()
    graph = {m: {i for i, _, _ in _own_imports(p) if i in modules and i != m} for m, p in modules.items()}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if nxt == "mlm_adapt" or nxt.startswith(node + "."):
                continue  # a package importing its own submodules is not a cycle through the package
            assert state.get(nxt) != 1, "import cycle: " + " -> ".join([*path, node, nxt])
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_no_module_over_600_lines():
    # One concern per module reads top to bottom up to a few hundred lines (LitGPT's average is ~300);
    # past ~600 a module holds more than one.
    sizes = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in _modules().items()}
    assert max(sizes.values()) <= 600, max(sizes.items(), key=lambda kv: kv[1])
