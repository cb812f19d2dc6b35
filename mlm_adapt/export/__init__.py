"""Export: the Hugging Face directory (weights, tokenizer, config, model card), its callback and the Hub."""

from mlm_adapt.export.callback import HFExport
from mlm_adapt.export.options import ExportOptions

__all__ = ["ExportOptions", "HFExport"]
