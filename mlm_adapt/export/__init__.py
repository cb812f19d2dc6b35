"""Export: the Hugging Face directory (weights, tokenizer, config, model card), its callback and the Hub.

The names below are imported on first use, so that reaching a light module of the package (its options, for
``python -m mlm_adapt export --help``) does not import torch and Lightning through the callback."""

from __future__ import annotations

from mlm_adapt.lazy_exports import lazy_exports

# Public name -> the module that defines it.
_EXPORTS = {"ExportOptions": "mlm_adapt.export.options", "HFExport": "mlm_adapt.export.callback"}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
