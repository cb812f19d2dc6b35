"""The package builds without setuptools' deprecation wall (scripts/setup.sh stays quiet).

The wheel's version is ``mlm_adapt.__version__`` (pyproject.toml reads it; one source)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from conftest import REPO

import mlm_adapt


@pytest.mark.slow
def test_build_prints_no_warnings(tmp_path):
    # A copy: building in place would leave build/ and *.egg-info in the checkout.
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "mlm_adapt", tmp_path / "mlm_adapt", ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--disable-pip-version-check", ".", "-w", str(tmp_path / "dist")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "deprecated" not in output.lower() and "warning" not in output.lower(), output[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.startswith(f"mlm_adapt-{mlm_adapt.__version__}-"), wheel.name
