"""Every file mlm_adapt loads: checkpoints, FSDP shards, ``pytorch_model.bin`` and safetensors, without code.

A ``.ckpt`` is a pickle; unpickling an untrusted one with ``weights_only=False`` runs whatever it names.
Every torch file goes through :func:`load_weights_only`: ``torch.load(weights_only=True)`` -- tensors,
containers and primitives only -- plus :data:`ALLOWED_GLOBALS`, the few other types mlm_adapt's own
checkpoints hold. Before torch sees a file it is classified (missing, a directory, empty, truncated, not a
``torch.save`` archive), so each failure is one line naming the file and the reason, never torch's advice
to load with ``weights_only=False``. FSDP sharded checkpoints: their ``.metadata`` (which torch reads with a
plain ``pickle.load``) goes through a restricted unpickler, and their non-tensor entries (``BYTE_IO``, which
torch unpickles with ``weights_only=False``) are read weights-only here. A safetensors header is checked
against the file's size before the safetensors library parses it.
"""

from __future__ import annotations

import io
import json
import pathlib
import pickle
import re
import struct
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.load import _METADATA_FILENAME
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from mlm_adapt.errors import MLMAdaptError, exception_line

# Types beyond what weights_only admits. mlm_adapt's own checkpoints (single device, DDP, streaming, FSDP
# full; checked with torch.serialization.get_unsafe_globals_in_checkpoint) need none; paths are allowed
# because hyper-parameters given from Python (MLMDataModule(cache_dir=Path(...))) are stored as such.
ALLOWED_GLOBALS: list[Any] = [pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePosixPath]

# The safetensors library's own limit on the JSON header (its Rust reader refuses more).
MAX_SAFETENSORS_HEADER = 100_000_000
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTO = 0x80  # torch.save's legacy (pre-zip) format starts with a pickle PROTO opcode

# What torch.distributed.checkpoint pickles into ``.metadata`` (classes are called only with the
# pickled arguments, i.e. constructed, which is harmless for these).
_DCP_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("collections", "OrderedDict"),
} | {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
}
# Advice in torch's messages that must never reach the user: it disables the safety this module adds.
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


def _first_safe_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type where that line advises disabling a safety."""
    if any(advice in str(exc) for advice in _UNSAFE_ADVICE):
        return type(exc).__name__
    return exception_line(exc)


def check_torch_file(
    path: str | Path, key: str = "--ckpt_path", what: str = "a .ckpt file the trainer wrote"
) -> Path:
    """Refuses, with one line, a path that cannot be a ``torch.save`` file (before torch reads it).

    Args:
        path: The file.
        key: The option that named ``path``, for messages.
        what: What the option expects, for the hint.

    Returns:
        ``path`` as a ``Path``.
    """
    path = Path(path)
    if not path.exists():
        raise MLMAdaptError(f"{key}: {path} does not exist; give {what}")
    if path.is_dir():
        raise MLMAdaptError(f"{key}: {path} is a directory, not a checkpoint file; give {what}")
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError as exc:
        raise MLMAdaptError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None
    reason = None
    if size == 0:
        reason = "it is empty (0 bytes)"
    elif head == _ZIP_MAGIC:
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError, EOFError):
            names = None
            reason = f"it is truncated ({size} bytes, no zip directory: an interrupted write or copy)"
        if names is not None and not any(name.endswith("data.pkl") for name in names):
            reason = "it is a zip archive without data.pkl, not a checkpoint"
    elif head[0] != _PICKLE_PROTO:
        reason = "it is not a checkpoint (garbage: not a torch.save file)"
    if reason is not None:
        raise MLMAdaptError(f"{key}: cannot read {path} as a Lightning checkpoint: {reason}; give {what}")
    return path


def load_weights_only(
    path: str | Path, key: str = "--ckpt_path", map_location: Any = "cpu", mmap: bool = False
) -> Any:
    """``torch.load(path, weights_only=True)`` with :data:`ALLOWED_GLOBALS`; one-line errors.

    Args:
        path: A file written by ``torch.save``.
        key: The option that named ``path``, for messages.
        map_location: Where tensors go (default CPU).
        mmap: Map the tensors' storage instead of reading it (to look at the other entries cheaply).
    """
    path = check_torch_file(path, key)
    # torch maps only zip-format files; a legacy-format file is read whole (still weights-only), so that
    # its refusal names the real reason rather than torch's mmap complaint.
    mmap = mmap and zipfile.is_zipfile(path)
    try:
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        raise _refusal(path, key, exc) from None
    except (RuntimeError, EOFError, ValueError, OSError, KeyError, AttributeError, struct.error) as exc:
        raise MLMAdaptError(
            f"{key}: cannot read {path} as a Lightning checkpoint: damaged ({_first_safe_line(exc)})"
        ) from None


def _load_bytes_weights_only(value: io.BytesIO, where: str) -> Any:
    try:
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            return torch.load(value, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise _refusal(Path(where), "--ckpt_path", exc) from None


class _WeightsOnlyPlanner(_EmptyStateDictLoadPlanner):
    """Torch's planner for reading a whole sharded checkpoint, with its non-tensor entries read weights-only.

    torch's own ``load_bytes`` unpickles them with ``weights_only=False``: a crafted shard could run code.
    """

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        loaded = _load_bytes_weights_only(value, f"{self.directory} (entry {fqn})")
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
    """Unpickles the ``torch.distributed.checkpoint`` metadata of ``path`` with the restricted unpickler.

    torch reads these files with a plain ``pickle.load``; they must pass this check first, so a crafted
    file is refused before torch runs anything from it (the shards themselves are read weights-only).
    """
    for metadata_file in sorted(Path(path).glob("*.metadata")):
        if metadata_file.stat().st_size == 0:
            raise MLMAdaptError(f"{key}: {metadata_file} is empty (0 bytes): not a sharded checkpoint")
        try:
            with open(metadata_file, "rb") as handle:
                _MetadataUnpickler(handle).load()
        except (pickle.UnpicklingError, AttributeError, EOFError, ValueError, TypeError, IndexError) as exc:
            raise _refusal(metadata_file, key, exc) from None


def _wrapped_refusal(exc: BaseException) -> MLMAdaptError | None:
    """The :class:`MLMAdaptError` a sharded load raised, also where torch wrapped it (``CheckpointException``
    keeps each rank's failure in ``failures``)."""
    if isinstance(exc, MLMAdaptError):
        return exc
    for failure in (getattr(exc, "failures", None) or {}).values():
        inner = failure[0] if isinstance(failure, tuple) else failure  # (exception, stack summary)
        if isinstance(inner, MLMAdaptError):
            return inner
    return None


def load_sharded(path: str | Path, key: str = "--ckpt_path") -> dict[str, Any]:
    """An FSDP sharded checkpoint directory as one full dictionary, read without running code.

    The same steps as Lightning's ``_load_distributed_checkpoint`` (used by its ``consolidate_checkpoint``
    utility), after :func:`check_sharded_metadata`, with a weights-only ``meta.pt`` and weights-only
    non-tensor entries.
    """
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
        refused = _wrapped_refusal(exc)
        if refused is not None:
            raise refused from None
        raise MLMAdaptError(
            f"{key}: cannot read the shards of {path}: damaged sharded checkpoint ({_first_safe_line(exc)})"
        ) from None
    checkpoint.update(meta)
    return checkpoint


def check_safetensors(path: str | Path, key: str) -> None:
    """Refuses a safetensors file whose header does not fit the file, before the library parses it.

    The format is an 8-byte little-endian header length, that many bytes of JSON, then the tensor data; a
    crafted length (2**62) or a truncated file is one line here instead of an allocation or a traceback.
    """
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        raise MLMAdaptError(f"{key}: {path} is empty (0 bytes): not a safetensors file")
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise MLMAdaptError(f"{key}: {path} is truncated ({size} bytes): not a safetensors file")
        header_size = int.from_bytes(prefix, "little")
        if header_size > min(MAX_SAFETENSORS_HEADER, size - 8):
            raise MLMAdaptError(
                f"{key}: {path} declares a {header_size}-byte safetensors header in a {size}-byte file: "
                "truncated or not a safetensors file"
            )
        raw = handle.read(header_size)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise MLMAdaptError(f"{key}: {path} has a header that is not JSON: not a safetensors file") from None
    if not isinstance(header, dict):
        raise MLMAdaptError(f"{key}: {path} has a header that is not a JSON object: not a safetensors file")
    data_size = size - 8 - header_size
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise MLMAdaptError(f"{key}: {path}: tensor {name!r} has no valid data_offsets: damaged file")
        if not 0 <= offsets[0] <= offsets[1] <= data_size:
            raise MLMAdaptError(
                f"{key}: {path} is truncated: tensor {name!r} ends at byte {offsets[1]} of {data_size}"
            )


def is_sharded_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a directory in FSDP's sharded-checkpoint layout (``.metadata`` or ``meta.pt``)."""
    path = Path(path)
    return path.is_dir() and ((path / ".metadata").is_file() or (path / _METADATA_FILENAME).is_file())
