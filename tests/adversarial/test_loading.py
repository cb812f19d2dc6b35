"""Every file mlm_adapt loads, crafted or damaged: one ``mlm_adapt: error:`` line, exit 2, no code run.

Each case builds the file (or directory) an attacker or an accident would leave, runs the command in
process, and asserts exactly one error line holding the expected reason, status 2, that torch's advice to
disable the safety (``weights_only=False``, ``_use_new_zipfile_serialization``) never reaches the user, and
that the sentinel file the payload would create does not exist.
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from _payloads_and_callbacks import CreatesMarker
from conftest import tiny_fit_args
from lightning.fabric.strategies.fsdp import _distributed_checkpoint_save
from lightning.fabric.utilities.load import _METADATA_FILENAME

from mlm_adapt.cli.commands import main
from mlm_adapt.guard.loads import load_sharded
from mlm_adapt.model.module import CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_KEY

UNSAFE_ADVICE = (
    "weights_only=False",
    "weights_only`",
    "_use_new_zipfile_serialization",
    "trust_remote_code=True",
)
TEXT = "北京[MASK]你"
FORMAT = {CHECKPOINT_FORMAT_KEY: CHECKPOINT_FORMAT}


def fails_with(args: list[str], capsys, code: int = 2) -> str:
    """Runs the CLI in process; returns its one error line (asserting the status and the one line)."""
    with pytest.raises(SystemExit) as stopped:
        main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("mlm_adapt: error:")]
    assert stopped.value.code == code, err[-2000:]
    assert len(lines) == 1, err[-2000:]
    assert not any(advice in err for advice in UNSAFE_ADVICE), err[-2000:]
    assert "Traceback" not in err
    return lines[0]


# --- checkpoint files: (build(path, sentinel) -> path, expected reason) -------------------------------------


def crafted(path: Path, sentinel: Path) -> Path:
    torch.save(
        {"state_dict": {"w": torch.zeros(2)}, "hyper_parameters": {"x": CreatesMarker(sentinel)}}, path
    )
    return path


def garbage(path: Path, sentinel: Path) -> Path:
    path.write_bytes(bytes(range(256)) * 40)
    return path


def _checkpoint_bytes(directory: Path) -> bytes:
    """A small zip-format checkpoint shaped like Lightning's (what the damaged cases start from)."""
    source = directory / "source.pt"
    torch.save({"state_dict": {"w": torch.arange(4096.0)}, "global_step": 4, "hyper_parameters": {}}, source)
    data = source.read_bytes()
    source.unlink()
    return data


def truncated(path: Path, sentinel: Path) -> Path:
    data = _checkpoint_bytes(path.parent)
    path.write_bytes(data[: len(data) // 2])
    return path


def without_format(path: Path, sentinel: Path) -> Path:
    """A readable checkpoint without this version's format key (another version's, or not mlm_adapt's)."""
    torch.save({"state_dict": {"w": torch.zeros(2)}, "global_step": 1, "hyper_parameters": {}}, path)
    return path


def plain_directory(path: Path, sentinel: Path) -> Path:
    path.mkdir()
    (path / "notes.txt").write_text("not a checkpoint", encoding="utf-8")
    return path


def sharded(path: Path, extra: dict) -> Path:
    """An FSDP sharded checkpoint as FSDPStrategy lays it out: DCP shards + .metadata, the rest in meta.pt."""
    _distributed_checkpoint_save({"model": {"model.w": torch.arange(6.0).reshape(2, 3)}, **extra}, path)
    meta = {"global_step": 3, "hyper_parameters": {"model_name_or_path": "x"}, **FORMAT}
    torch.save(meta, path / _METADATA_FILENAME)
    return path


def sharded_bytes_entry(path: Path, sentinel: Path) -> Path:
    # torch stores a non-tensor entry as BYTE_IO and would load it with weights_only=False.
    return sharded(path, {"optimizer_states": [CreatesMarker(sentinel)]})


def sharded_crafted_metadata(path: Path, sentinel: Path) -> Path:
    sharded(path, {})
    (path / ".metadata").write_bytes(pickle.dumps(CreatesMarker(sentinel)))
    return path


CHECKPOINTS: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "crafted_pickle": (crafted, "refusing to load {ckpt}: it needs exec"),
    "garbage": (garbage, "cannot read {ckpt}: not a checkpoint (its pickle is damaged or foreign)"),
    "truncated": (truncated, "cannot read {ckpt} as a Lightning checkpoint: damaged ("),
    "without_format": (without_format, "was written by mlm_adapt 0.2 or earlier"),
    "directory_not_a_checkpoint": (plain_directory, "{ckpt} is a directory but neither a checkpoint"),
    "fsdp_bytes_entry_payload": (sharded_bytes_entry, "refusing to load {ckpt} (entry optimizer_states)"),
    "fsdp_crafted_metadata": (sharded_crafted_metadata, "refusing to load {ckpt}/.metadata: it needs"),
}


@pytest.mark.parametrize("case", list(CHECKPOINTS), ids=list(CHECKPOINTS))
def test_export_ckpt_path(case, tmp_path, capsys):
    build, reason = CHECKPOINTS[case]
    sentinel = tmp_path / "pwned"
    ckpt = build(tmp_path / "evil.ckpt", sentinel)
    out = tmp_path / "out"
    line = fails_with(["export", "--ckpt_path", str(ckpt), "--output_dir", str(out)], capsys)
    assert reason.format(ckpt=ckpt) in line, line
    assert not sentinel.exists() and not out.exists()


@pytest.fixture
def small_corpus(tmp_path, review_texts) -> Path:
    path = tmp_path / "corpus" / "small.txt"
    path.parent.mkdir()
    path.write_text("\n".join(review_texts[:40]) + "\n", encoding="utf-8")
    return path


TRAINER_CASES = {
    "fit_crafted_pickle": ("fit", "crafted_pickle"),
    "validate_truncated": ("validate", "truncated"),
}


@pytest.mark.parametrize("case", list(TRAINER_CASES), ids=list(TRAINER_CASES))
def test_trainer_ckpt_path(case, tiny_model_dir, small_corpus, tmp_path, capsys):
    command, kind = TRAINER_CASES[case]
    build, reason = CHECKPOINTS[kind]
    sentinel = tmp_path / "pwned"
    ckpt = build(tmp_path / "evil.ckpt", sentinel)
    root = tmp_path / "run"
    args = tiny_fit_args(
        tiny_model_dir, small_corpus, root, "--export.checkpoint=none", f"--ckpt_path={ckpt}"
    )
    line = fails_with([command, *args], capsys)
    assert reason.format(ckpt=ckpt) in line, line
    assert not sentinel.exists()


# --- Hugging Face model directories: (damage(directory, sentinel), expected reason) -------------------------


def remote_code(directory: Path, sentinel: Path) -> None:
    (directory / "evil.py").write_text(f"open({str(sentinel)!r}, 'w').close()\n", encoding="utf-8")
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForMaskedLM": "evil.EvilModel"}
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")


def remote_code_tokenizer(directory: Path, sentinel: Path) -> None:
    (directory / "evil.py").write_text(f"open({str(sentinel)!r}, 'w').close()\n", encoding="utf-8")
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    path.write_text(json.dumps(config), encoding="utf-8")


def malicious_bin(directory: Path, sentinel: Path) -> None:
    (directory / "model.safetensors").unlink()
    torch.save(
        {"bert.embeddings.word_embeddings.weight": CreatesMarker(sentinel)}, directory / "pytorch_model.bin"
    )


def huge_safetensors_header(directory: Path, sentinel: Path) -> None:
    (directory / "model.safetensors").write_bytes((2**62).to_bytes(8, "little") + b"{}")


def no_tokenizer_files(directory: Path, sentinel: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (directory / name).unlink(missing_ok=True)


def no_config(directory: Path, sentinel: Path) -> None:
    (directory / "config.json").unlink()


def garbage_config(directory: Path, sentinel: Path) -> None:
    (directory / "config.json").write_bytes(b"\x00\xff garbage {")


MODEL_DIRS: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "auto_map_model_code": (remote_code, "needs code"),
    "auto_map_tokenizer_code": (remote_code_tokenizer, "needs code"),
    "malicious_pytorch_model_bin": (malicious_bin, "needs code"),
    "safetensors_header_2_pow_62": (huge_safetensors_header, "safetensors header"),
    "no_tokenizer_files": (no_tokenizer_files, "no tokenizer files"),
    "no_config_json": (no_config, "no config.json"),
    "garbage_config_json": (garbage_config, "not JSON"),
}


@pytest.mark.parametrize("case", list(MODEL_DIRS), ids=list(MODEL_DIRS))
def test_fill_mask_model_directory(case, tiny_model_dir, tmp_path, capsys, monkeypatch):
    damage, reason = MODEL_DIRS[case]
    model = tmp_path / "remote_model"
    shutil.copytree(tiny_model_dir, model)
    sentinel = tmp_path / "pwned"
    damage(model, sentinel)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 10))  # `echo y | mlm fill-mask ...`
    line = fails_with(["fill-mask", "--model", str(model), TEXT], capsys)
    assert str(model) in line and reason in line, line
    assert ".ckpt" not in line  # a model directory is not told to give a checkpoint
    assert not sentinel.exists()


FIT_BASE_MODELS = ["auto_map_model_code", "malicious_pytorch_model_bin"]


@pytest.mark.parametrize("case", FIT_BASE_MODELS, ids=FIT_BASE_MODELS)
def test_fit_base_model_directory(case, tiny_model_dir, small_corpus, tmp_path, capsys):
    damage, reason = MODEL_DIRS[case]
    model = tmp_path / "base"
    shutil.copytree(tiny_model_dir, model)
    sentinel = tmp_path / "pwned"
    damage(model, sentinel)
    args = tiny_fit_args(model, small_corpus, tmp_path / "run", "--export.checkpoint=none")
    line = fails_with(["fit", *args], capsys)
    assert line.startswith("mlm_adapt: error: model.model_name_or_path:") and reason in line, line
    assert not sentinel.exists()


def test_intact_copies_still_load(tiny_model_dir, tmp_path, capsys):
    """The checks refuse only the damage: the untouched model directory and checkpoint work."""
    main(["fill-mask", "--model", str(tiny_model_dir), TEXT])
    assert "北京" in capsys.readouterr().out
    checkpoint = sharded(tmp_path / "ok.ckpt", {"optimizer_states": [{"lr": 0.1, "step": 3}]})
    assert load_sharded(checkpoint)["optimizer_states"] == [{"lr": 0.1, "step": 3}]


def test_a_file_a_checkpoint_names_is_never_read_into_the_export(tiny_model_dir, tmp_path):
    """The export's new tokens are the checkpoint's own, not the lines of the file its hparams name."""
    from transformers import AutoTokenizer

    from mlm_adapt.model.module import MaskedLMModule

    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key=EXAMPLEKEY\n", encoding="utf-8")
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("好评如潮\n", encoding="utf-8")
    module = MaskedLMModule(str(tiny_model_dir), max_seq_length=64, new_tokens_file=str(tokens))
    checkpoint = {"state_dict": module.state_dict(), "global_step": 1}
    module.on_save_checkpoint(checkpoint)  # as fit writes it: the format and the tokens it added
    checkpoint["hyper_parameters"] = {**dict(module.hparams), "new_tokens_file": str(secret)}
    ckpt = tmp_path / "crafted.ckpt"
    torch.save(checkpoint, ckpt)
    main(["export", f"--ckpt_path={ckpt}", f"--output_dir={tmp_path / 'out'}"])
    exported = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert "好评如潮" in exported.get_vocab()
    assert not any("EXAMPLEKEY" in token for token in exported.get_vocab())
    assert "EXAMPLEKEY" not in "".join(p.read_text(errors="ignore") for p in (tmp_path / "out").iterdir())
