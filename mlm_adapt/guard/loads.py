"""Every file mlm_adapt loads, without running code from it.

- Torch files: ``torch.load(weights_only=True)`` plus :data:`ALLOWED_GLOBALS`; a failure is one line, never
  torch's advice to load with ``weights_only=False``.
- FSDP sharded checkpoints: torch reads ``.metadata`` with a plain ``pickle.load`` and the non-tensor
  entries with ``weights_only=False``; here a restricted unpickler and weights-only loads read them.
- safetensors: ``safe_open`` checks the header against the file before anything is allocated.
- Hugging Face directories and Hub names: ``trust_remote_code=False`` always (transformers would otherwise
  ask on stdin, and accept a piped ``y``); a local directory is checked first (config, tokenizer files, no
  ``auto_map`` code, weight files readable as above).
"""

from __future__ import annotations

import io
import json
import pathlib
import pickle
import re
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy
import numpy._core.multiarray as numpy_multiarray
import torch
from lightning.fabric.utilities.load import _METADATA_FILENAME
from safetensors import safe_open
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError, check_model_path, exception_line

# Types beyond what weights_only admits: hyper-parameters given from Python (cache_dir=Path(...)) are stored
# as paths, and callbacks keep numpy scalars and arrays in their state (a ModelCheckpoint-like best score as
# np.float64). The numpy constructors are the ones torch's serialization notes allowlist for this: they
# build an array or scalar from plain data and a dtype, and reach no other global.
ALLOWED_GLOBALS: list[Any] = [
    pathlib.PosixPath,
    pathlib.WindowsPath,
    pathlib.PurePosixPath,
    numpy.ndarray,
    numpy.dtype,
    numpy_multiarray._reconstruct,
    numpy_multiarray.scalar,
    *(getattr(numpy.dtypes, name) for name in numpy.dtypes.__all__),
]
TRUST_REMOTE_CODE = False
# Files that hold a tokenizer's vocabulary (one is enough; tokenizer_config.json alone is not).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model")
# What torch.distributed.checkpoint pickles into ``.metadata`` (harmless: built from pickled arguments).
_DCP_METADATA_CLASSES = ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties")
_DCP_METADATA_CLASSES += ("TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata")
_DCP_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("collections", "OrderedDict"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    *(("pathlib", name) for name in ("PosixPath", "PurePosixPath", "WindowsPath")),
    *(("torch.distributed.checkpoint.metadata", name) for name in _DCP_METADATA_CLASSES),
}
# Advice in library messages that must never reach the user: it disables the safety this module adds.
_UNSAFE_ADVICE = ("weights_only", "_use_new_zipfile_serialization", "trust_remote_code")


def _refusal(path: Path, key: str, exc: Exception) -> MLMAdaptError:
    found = re.search(r"GLOBAL ([\w.]+)", str(exc))
    if found is None:  # not a forbidden type: a damaged or foreign file
        return MLMAdaptError(
            f"{key}: cannot read {path}: not a checkpoint (its pickle is damaged or foreign)"
        )
    return MLMAdaptError(
        f"{key}: refusing to load {path}: it needs {found.group(1)}, and unpickling that could run code "
        "(needs code); mlm_adapt loads checkpoints weights-only (tensors and plain data), as its own need"
    )


def _torch_load(source: Path | io.BytesIO, key: str, where: Path, **kwargs: Any) -> Any:
    try:
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            return torch.load(source, weights_only=True, **kwargs)
    except pickle.UnpicklingError as exc:
        raise _refusal(where, key, exc) from None


def load_weights_only(
    path: str | Path, key: str = "--ckpt_path", map_location: Any = "cpu", mmap: bool = False
) -> Any:
    """``torch.load(path, weights_only=True)`` with :data:`ALLOWED_GLOBALS` and one-line errors.

    ``mmap`` maps the tensors' storage (torch maps only zip files: a legacy one is read whole, so that its
    refusal names the real reason rather than torch's mmap complaint).
    """
    path = Path(path)
    if not path.is_file():
        raise MLMAdaptError(f"{key}: {path} is not a file; give a .ckpt file the trainer wrote")
    try:
        return _torch_load(path, key, path, map_location=map_location, mmap=mmap and zipfile.is_zipfile(path))
    except (RuntimeError, EOFError, ValueError, OSError, KeyError, AttributeError, struct.error) as exc:
        raise MLMAdaptError(
            f"{key}: cannot read {path} as a Lightning checkpoint: damaged ({safe_line(exc)})"
        ) from None


class _WeightsOnlyPlanner(_EmptyStateDictLoadPlanner):
    """Torch's planner for a whole sharded checkpoint, with non-tensor entries read weights-only (torch's
    own ``load_bytes`` unpickles them with ``weights_only=False``: a crafted shard could run code)."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        loaded = _torch_load(
            value, "--ckpt_path", Path(f"{self.directory} (entry {fqn})"), map_location="cpu"
        )
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


class _MetadataUnpickler(pickle.Unpickler):
    """Admits only the classes ``torch.distributed.checkpoint`` writes into ``.metadata``."""

    def find_class(self, module: str, name: str) -> Any:
        is_dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if is_dtype or (module, name) in _DCP_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"Unsupported GLOBAL {module}.{name}")


def check_sharded_metadata(path: str | Path, key: str = "--ckpt_path") -> None:
    """Unpickles the ``*.metadata`` of ``path`` with the restricted unpickler, before torch's plain
    ``pickle.load`` could run anything from a crafted one."""
    for metadata_file in sorted(Path(path).glob("*.metadata")):
        if metadata_file.stat().st_size == 0:
            raise MLMAdaptError(f"{key}: {metadata_file} is empty (0 bytes): not a sharded checkpoint")
        try:
            with open(metadata_file, "rb") as handle:
                _MetadataUnpickler(handle).load()
        except (pickle.UnpicklingError, AttributeError, EOFError, ValueError, TypeError, IndexError) as exc:
            raise _refusal(metadata_file, key, exc) from None


def load_sharded(path: str | Path, key: str = "--ckpt_path") -> dict[str, Any]:
    """An FSDP sharded checkpoint directory as one dictionary, read without running code: Lightning's
    ``_load_distributed_checkpoint`` after :func:`check_sharded_metadata`, with ``meta.pt`` and the
    non-tensor entries read weights-only."""
    path = Path(path)
    if not (path / ".metadata").is_file():
        raise MLMAdaptError(f"{key}: {path} has no .metadata: not a complete FSDP sharded checkpoint")
    check_sharded_metadata(path, key)
    extra = path / _METADATA_FILENAME
    meta = load_weights_only(extra, key) if extra.is_file() else {}
    checkpoint: dict[str, Any] = {}
    try:
        _load_state_dict(
            checkpoint, storage_reader=FileSystemReader(path), planner=_WeightsOnlyPlanner(path), no_dist=True
        )
    except (Exception, CheckpointException) as exc:  # torch wraps a shard's failure (a BaseException)
        # CheckpointException keeps each rank's failure in ``failures``: (exception, stack summary).
        failures = [f[0] if isinstance(f, tuple) else f for f in getattr(exc, "failures", {}).values()]
        refused = next((e for e in [exc, *failures] if isinstance(e, MLMAdaptError)), None)
        if refused is not None:
            raise refused from None
        raise MLMAdaptError(
            f"{key}: cannot read the shards of {path}: damaged sharded checkpoint ({safe_line(exc)})"
        ) from None
    checkpoint.update(meta)
    return checkpoint


def weight_files(directory: Path) -> list[Path]:
    """The weight files transformers reads from a model directory: its safetensors, else its ``.bin``."""
    return sorted(directory.glob("*.safetensors")) or sorted(directory.glob("pytorch_model*.bin"))


def weight_shapes(path: Path, key: str) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in a weight file, from its header (safetensors) or memory-mapped (``.bin``)."""
    if path.suffix == ".safetensors":
        try:
            with safe_open(str(path), framework="pt") as handle:
                return {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118 -- no __iter__
        except Exception as exc:  # the safetensors library raises its own error types
            raise MLMAdaptError(
                f"{key}: cannot read {path}: its safetensors header does not fit the file "
                f"({exception_line(exc)}): truncated or not a safetensors file"
            ) from None
    state = load_weights_only(path, key, mmap=True)
    if not isinstance(state, dict):
        raise MLMAdaptError(
            f"{key}: {path} holds no state dict (a {type(state).__name__}); not a weight file"
        )
    return {name: tuple(t.shape) for name, t in state.items() if isinstance(t, torch.Tensor)}


def is_sharded_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a directory in FSDP's sharded-checkpoint layout (``.metadata`` or ``meta.pt``)."""
    path = Path(path)
    return path.is_dir() and ((path / ".metadata").is_file() or (path / _METADATA_FILENAME).is_file())


# --- Hugging Face directories and Hub names ----------------------------------------------------------------


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


def _refuse_remote_code(directory: Path, key: str) -> None:
    """Refuses a directory whose config names code to run (``auto_map``), before transformers reads it."""
    for path in (directory / "config.json", directory / "tokenizer_config.json"):
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
    _refuse_remote_code(directory, key)


def check_weight_files(directory: Path, key: str) -> None:
    """Reads the headers (safetensors) or weights-only pickles (``.bin``) transformers would read."""
    for path in weight_files(directory):
        weight_shapes(path, key)


def _check_tokenizer_dir(directory: Path, key: str) -> None:
    if not any(directory.glob("*.model")) and not any((directory / n).is_file() for n in TOKENIZER_FILES):
        raise MLMAdaptError(
            f"{key}: {directory} has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...); save the "
            "tokenizer into it too (tokenizer.save_pretrained) or name the original model"
        )
    _refuse_remote_code(directory, key)


def safe_line(exc: BaseException) -> str:
    """The first line of a library's error, or what it means where that line advises disabling a safety."""
    if any(advice in str(exc) for advice in _UNSAFE_ADVICE):
        return f"{type(exc).__name__} (the files need code or unsafe unpickling, which mlm_adapt refuses)"
    return exception_line(exc)


def check_local(name: str, key: str, *checks: Callable[[Path, str], None]) -> None:
    """Refuses a bad ``name``; for a local directory, runs ``checks`` on it before anything is loaded."""
    check_model_path(name, key)
    directory = Path(name).expanduser()
    if directory.is_dir():
        for check in checks:
            check(directory, key)


def pretrained_config(name: str, key: str) -> PretrainedConfig:
    """``AutoConfig.from_pretrained(name, trust_remote_code=False)`` after the local checks."""
    return _from_pretrained(AutoConfig, "a model config", check_config_dir, name, key)


def pretrained_tokenizer(name: str, key: str) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained(name, trust_remote_code=False)`` after the local checks."""
    return _from_pretrained(AutoTokenizer, "a tokenizer", _check_tokenizer_dir, name, key)


def _from_pretrained(auto: Any, what: str, check: Callable[[Path, str], None], name: str, key: str) -> Any:
    check_local(name, key, check)
    try:
        return auto.from_pretrained(name, trust_remote_code=TRUST_REMOTE_CODE)
    except Exception as exc:
        raise MLMAdaptError(f"{key}: cannot load {what} from {name!r}: {safe_line(exc)}") from None
