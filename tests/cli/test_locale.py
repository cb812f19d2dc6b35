"""Configs are read as UTF-8 whatever the locale: the shipped ``configs/domain.yaml`` (Chinese in it) under a
``zh_CN.GBK`` locale and under ``C`` without Python's UTF-8 mode."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO, run_cli


def gbk_locale(root: Path) -> dict[str, str]:
    """``zh_CN.GBK`` compiled into ``root`` (``LOCPATH``), as a Chinese Windows-era Linux box has it."""
    if shutil.which("localedef") is None:
        pytest.skip("localedef not installed")
    built = subprocess.run(
        ["localedef", "-i", "zh_CN", "-f", "GBK", str(root / "zh_CN.GBK")], capture_output=True
    )
    if not (root / "zh_CN.GBK").is_dir():
        pytest.skip(f"zh_CN.GBK cannot be compiled here: {built.stderr.decode(errors='replace')[-200:]}")
    return {"LOCPATH": str(root), "LC_ALL": "zh_CN.GBK", "PYTHONUTF8": "0"}


@pytest.mark.parametrize("name", ["zh_CN.GBK", "C"])
def test_the_shipped_config_is_read_as_utf8_under_any_locale(name, tmp_path, monkeypatch):
    config = REPO / "configs" / "domain.yaml"
    assert not config.read_bytes().isascii()  # the case: a UTF-8 file that this locale cannot decode
    environment = gbk_locale(tmp_path) if name == "zh_CN.GBK" else {"LC_ALL": "C", "PYTHONUTF8": "0"}
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    result = run_cli("fit", "--config", str(config), "--print_config", fresh_interpreter=True)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = yaml.safe_load(result.stdout)
    assert printed["data"] is not None and printed["model"]["model_name_or_path"]
