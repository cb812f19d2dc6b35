import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_suite_leaves_nothing_in_the_temp_directory(tmp_path):
    """A run of this suite (two xdist workers, its conftest's help cache, tmp_path, a library's and a
    subprocess's temp files) leaves the system's temp directory as it found it."""
    system_temp = tmp_path / "system-temp"
    system_temp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MLM_ADAPT_"))}
    env["TMPDIR"] = str(system_temp)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "tests/temp_writers.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 passed" in result.stdout
    assert sorted(p.name for p in system_temp.iterdir()) == []


def test_a_run_refused_at_its_arguments_leaves_nothing_in_the_temp_directory(tmp_path):
    """pytest stops at its arguments after importing the conftest, which made the run's temp directory: no
    hook runs, its exit still removes it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MLM_ADAPT_"))}
    env["TMPDIR"] = str(tmp_path)
    # addopts give -n, which pytest cannot read without xdist: a usage error.
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "tests/temp_writers.py"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 4, result.stderr[-3000:]  # pytest's usage error
    assert sorted(p.name for p in tmp_path.iterdir()) == []
