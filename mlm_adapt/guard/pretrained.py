"""Hugging Face model directories and Hub names, loaded without running code from them.

Every ``from_pretrained`` of the package goes through :func:`pretrained_config`, :func:`pretrained_masked_lm`
or :func:`pretrained_tokenizer`: each passes ``trust_remote_code=False`` explicitly (transformers would
otherwise ask on stdin, and accept a piped ``y``, before running a directory's ``auto_map`` code). A local
directory is checked first, so each failure is one line naming the file and the reason: no
``config.json``, no tokenizer files, ``auto_map`` code, a ``pytorch_model.bin`` that needs more than
weights-only unpickling (transformers would say to retry with ``weights_only=False``), a safetensors file
whose header does not fit it, weights whose shapes disagree with ``config.json``, and a model too large
for the memory free (:mod:`mlm_adapt.guard.model_size`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import (
    AutoConfig,
    AutoModelForMaskedLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from mlm_adapt.errors import MLMAdaptError, check_model_path, exception_line
from mlm_adapt.guard.loads import check_safetensors, load_weights_only
from mlm_adapt.guard.model_size import check_masked_lm

TRUST_REMOTE_CODE = False
# Files that hold a tokenizer's vocabulary (one is enough; tokenizer_config.json alone is not).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model")
_CODE_FILES = ("config.json", "tokenizer_config.json")


def _local_dir(name: str) -> Path | None:
    path = Path(name).expanduser()
    return path if path.is_dir() else None


def _json(path: Path, key: str) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        empty = path.is_file() and path.stat().st_size == 0
        reason = "empty" if empty else f"not JSON ({type(exc).__name__})"
        raise MLMAdaptError(f"{key}: cannot read {path}: {reason}; give a save_pretrained dir") from None
    if not isinstance(loaded, dict):
        raise MLMAdaptError(f"{key}: {path} is not a JSON object; give a save_pretrained directory")
    return loaded


def refuse_remote_code(directory: Path, key: str) -> None:
    """Refuses a directory whose config names code to run (``auto_map``), before transformers reads it."""
    for name in _CODE_FILES:
        path = directory / name
        if path.is_file() and "auto_map" in _json(path, key):
            raise MLMAdaptError(
                f"{key}: {path} names code to run (auto_map): needs code, and mlm_adapt never runs code "
                "from a model directory (trust_remote_code=False); use a model of a transformers class"
            )


def check_config_dir(directory: Path, key: str) -> None:
    """A local model directory must hold ``config.json`` and no ``auto_map`` code."""
    if not (directory / "config.json").is_file():
        raise MLMAdaptError(
            f"{key}: {directory} has no config.json, so it is not a Hugging Face model directory; give a "
            "directory written by save_pretrained (or export) or a Hub name"
        )
    refuse_remote_code(directory, key)


def check_weight_files(directory: Path, key: str) -> None:
    """Checks the weight files transformers would read: every safetensors header, else every ``.bin``."""
    safetensors = sorted(directory.glob("*.safetensors"))
    for path in safetensors:
        check_safetensors(path, key)
    if not safetensors:
        for path in sorted(directory.glob("pytorch_model*.bin")):
            load_weights_only(path, key, mmap=True)  # refuses what transformers' weights-only load would


def check_tokenizer_dir(directory: Path, key: str) -> None:
    """A local tokenizer directory must hold a vocabulary file and no ``auto_map`` code."""
    has_model_file = any(directory.glob("*.model"))
    if not has_model_file and not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise MLMAdaptError(
            f"{key}: {directory} has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...); save the "
            "tokenizer into it too (tokenizer.save_pretrained) or name the original model"
        )
    refuse_remote_code(directory, key)


def _one_line(exc: Exception) -> str:
    text = str(exc)
    if "trust_remote_code" in text or "weights_only" in text:
        return f"{type(exc).__name__} (the files need code or unsafe unpickling, which mlm_adapt refuses)"
    return exception_line(exc)


def _check_local(name: str, key: str, *checks: Callable[[Path, str], None]) -> None:
    """Refuses a bad ``name``; for a local directory, runs ``checks`` on it before anything is loaded."""
    check_model_path(name, key)
    directory = _local_dir(name)
    if directory is not None:
        for check in checks:
            check(directory, key)


def pretrained_config(name: str, key: str) -> PretrainedConfig:
    """``AutoConfig.from_pretrained(name, trust_remote_code=False)`` after the local checks."""
    _check_local(name, key, check_config_dir)
    try:
        return AutoConfig.from_pretrained(name, trust_remote_code=TRUST_REMOTE_CODE)
    except Exception as exc:
        raise MLMAdaptError(f"{key}: cannot load a model config from {name!r}: {_one_line(exc)}") from None


def pretrained_masked_lm(name: str, key: str, training: bool = False, **kwargs: Any) -> PreTrainedModel:
    """``AutoModelForMaskedLM.from_pretrained`` without code, after checking the weight files and the size.

    A ``ValueError`` other than a refused file is left to the caller (an architecture without an MLM head).

    Args:
        name: Hub name or local directory.
        key: The setting that named it (the messages start with it).
        training: Its gradients and AdamW's moments must fit in RAM too, not only its parameters.
        **kwargs: For ``from_pretrained`` (``config``: the already loaded config).
    """
    _check_local(name, key, check_config_dir, check_weight_files)
    config = kwargs.get("config") or pretrained_config(name, key)
    check_masked_lm(config, name, key, pretrained=True, training=training)
    try:
        return AutoModelForMaskedLM.from_pretrained(name, trust_remote_code=TRUST_REMOTE_CODE, **kwargs)
    except (OSError, ValueError) as exc:
        if isinstance(exc, ValueError) and "trust_remote_code" not in str(exc):
            raise
        raise MLMAdaptError(f"{key}: cannot load a masked LM from {name!r}: {_one_line(exc)}") from None


def pretrained_tokenizer(name: str, key: str) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained(name, trust_remote_code=False)`` after the local checks."""
    _check_local(name, key, check_tokenizer_dir)
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=TRUST_REMOTE_CODE)
    except Exception as exc:
        raise MLMAdaptError(f"{key}: cannot load a tokenizer from {name!r}: {_one_line(exc)}") from None
