"""mlm_adapt: domain-adaptive whole-word-masking MLM pretraining of Chinese BERT-family models (the packages
and their layers: docs/architecture.md)."""

from mlm_adapt.data import MLMDataModule
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.masking import WholeWordMaskCollator
from mlm_adapt.model import MaskedLMModule
from mlm_adapt.text.segmentation import Segmenter

__all__ = ["MLMAdaptError", "MLMDataModule", "MaskedLMModule", "Segmenter", "WholeWordMaskCollator"]
__version__ = "0.2.0"
