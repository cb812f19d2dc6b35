"""Every name a script imports from mlm_adapt exists.

Benchmarks and experiments import inside their functions (after setting up ``sys.path`` or to keep
``--help`` fast), so a renamed or merged module breaks them only when that function runs, long after
the change; this reads every ``from mlm_adapt... import`` of every script and resolves it.
"""

from __future__ import annotations

import ast
import importlib

import pytest
from conftest import REPO

SCRIPTS = sorted((REPO / "scripts").rglob("*.py"))


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mlm_adapt":
            for alias in node.names:
                yield node.lineno, node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "mlm_adapt":
                    yield node.lineno, alias.name, None


def _missing(module_name, name):
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return f"module {module_name}"
    if name is None or hasattr(module, name):
        return None
    try:
        importlib.import_module(f"{module_name}.{name}")
    except ImportError:
        return f"{module_name}.{name}"
    return None


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_mlm_adapt_import_of_a_script_resolves(script):
    missing = [
        f"line {line}: {what}"
        for line, module_name, name in _imports(script)
        if (what := _missing(module_name, name))
    ]
    assert not missing, f"{script.relative_to(REPO)} imports what mlm_adapt lacks: {missing}"


def test_the_check_finds_a_missing_name(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text("def f():\n    from mlm_adapt.data.preprocess import no_such_step\n")
    found = [what for _, module_name, name in _imports(script) if (what := _missing(module_name, name))]
    assert found == ["mlm_adapt.data.preprocess.no_such_step"]
