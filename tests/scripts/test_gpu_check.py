"""scripts/gpu_check.py: the dry run exercises every step on CPU; the real check runs only with CUDA."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from conftest import REPO

_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


def test_dry_run_prints_one_table_with_every_configuration_and_the_prepared_fit(tmp_path):
    text = gpu_check.main(["--dry-run", f"--workdir={tmp_path}"])
    throughput = text.split("GPU-only precisions")[0]
    rows = [line for line in throughput.splitlines() if line.startswith("| ") and "tokens/s" not in line]
    assert len(rows) == len(gpu_check.CONFIGS) + 1
    assert sum("torch.compile not available" in r for r in rows) == 2  # no GPU: compiled runs reported
    assert "masked-only head" in text and "full head" in text
    fit = rows[-1]
    assert fit.startswith("| fit from prepared dir: 4 steps (prepare ") and "validation " in fit
    assert (tmp_path / "fit" / "prepared" / "manifest.json").is_file()
    recipes = text.split("GPU-only precisions")[1]
    assert "| domain.yaml | 32-true (CPU) | ok: 2 steps, exported |" in recipes  # the one a CPU runs
    assert recipes.count("GPU only (dry run)") == len(gpu_check.RECIPES) - 1
    shipped = {p.name for p in (REPO / "configs").glob("*.yaml")}
    assert {config for config, _ in gpu_check.RECIPES} == shipped  # a new config joins the GPU check


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_check_on_a_gpu(tmp_path):
    text = gpu_check.main([f"--workdir={tmp_path}", "--fit-steps=20", "--steps=5"])
    assert "MFU" in text and "fit from prepared dir: 20 steps" in text
