"""Export: the Hugging Face directory (weights, tokenizer, config, model card), its callback and the Hub."""

from mlm_adapt.export.callback import HFExport
from mlm_adapt.export.writer import ExportOptions

__all__ = ["ExportOptions", "HFExport"]
