"""Export: the Hugging Face directory (weights, tokenizer, config, model card), its callback and the Hub.

The names below are imported on first use, so that reaching a light module of the package (its options, for
``python -m mlm_adapt export --help``) does not import torch and Lightning through the callback."""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the module that defines it.
_EXPORTS = {"ExportOptions": "mlm_adapt.export.options", "HFExport": "mlm_adapt.export.callback"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
