"""Loading checkpoint files without running code from them.

A ``.ckpt`` is a pickle; unpickling an untrusted one with ``weights_only=False`` runs whatever it names.
Every checkpoint a user hands to mlm_adapt (``fit --ckpt_path``, ``export --ckpt_path``, ``fill-mask
--model X.ckpt``, the best checkpoint exported at the end of ``fit``) goes through here instead:
``torch.load(weights_only=True)`` -- tensors, containers and primitives only -- plus :data:`ALLOWED_GLOBALS`,
the few other types mlm_adapt's own checkpoints hold. A file that names anything else is refused with one
line naming the file and the global. FSDP sharded checkpoints are read the same way: their
``torch.distributed.checkpoint`` metadata (a plain pickle, which torch itself reads with ``pickle.load``)
goes through a restricted unpickler that admits only the metadata classes.
"""

from __future__ import annotations

import pathlib
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.load import _METADATA_FILENAME
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from mlm_adapt.errors import MLMAdaptError

# Types beyond what weights_only admits. mlm_adapt's own checkpoints (single device, DDP, streaming, FSDP
# full; checked with torch.serialization.get_unsafe_globals_in_checkpoint) need none; paths are allowed
# because hyper-parameters given from Python (MLMDataModule(cache_dir=Path(...))) are stored as such.
ALLOWED_GLOBALS: list[Any] = [pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePosixPath]

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


def _refusal(path: Path, key: str, exc: Exception) -> MLMAdaptError:
    found = re.search(r"GLOBAL ([\w.]+)", str(exc))
    if found is None:  # not a forbidden type: a damaged or foreign file
        detail = re.search(r"WeightsUnpickler error: \s*(.+)", str(exc))
        reason = detail.group(1).strip() if detail else type(exc).__name__
        return MLMAdaptError(f"{key}: cannot read {path} as a Lightning checkpoint ({reason})")
    what = found.group(1)
    return MLMAdaptError(
        f"{key}: refusing to load {path}: it needs {what}, and unpickling that could run code; mlm_adapt "
        "loads checkpoints with weights_only=True (tensors and plain data only), as its own checkpoints need"
    )


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
    path = Path(path)
    try:
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        raise _refusal(path, key, exc) from None
    except FileNotFoundError:
        raise MLMAdaptError(f"{key}: {path} does not exist; give a .ckpt file the trainer wrote") from None
    except (RuntimeError, EOFError, ValueError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MLMAdaptError(f"{key}: cannot read {path} as a Lightning checkpoint: {first}") from None


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
    file is refused before torch runs anything from it (the shards themselves torch reads weights-only).
    """
    for metadata_file in sorted(Path(path).glob("*.metadata")):
        try:
            with open(metadata_file, "rb") as handle:
                _MetadataUnpickler(handle).load()
        except (pickle.UnpicklingError, AttributeError, EOFError, ValueError) as exc:
            raise _refusal(metadata_file, key, exc) from None


def load_sharded(path: str | Path, key: str = "--ckpt_path") -> dict[str, Any]:
    """An FSDP sharded checkpoint directory as one full dictionary, read without running code.

    The same steps as Lightning's ``_load_distributed_checkpoint`` (used by its ``consolidate_checkpoint``
    utility), after :func:`check_sharded_metadata` and with a weights-only ``meta.pt``.
    """
    path = Path(path)
    check_sharded_metadata(path, key)
    extra = path / _METADATA_FILENAME
    meta = load_weights_only(extra, key) if extra.is_file() else {}
    checkpoint: dict[str, Any] = {}
    _load_state_dict(
        checkpoint,
        storage_reader=FileSystemReader(path),
        planner=_EmptyStateDictLoadPlanner(),
        no_dist=True,
    )
    checkpoint.update(meta)
    return checkpoint
