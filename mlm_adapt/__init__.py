"""mlm_adapt: domain-adaptive whole-word-masking MLM pretraining of Chinese BERT-family models."""

from mlm_adapt.data import MLMDataModule
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.masking import WholeWordMaskCollator
from mlm_adapt.model import MaskedLMModule
from mlm_adapt.segment import Segmenter

__all__ = ["MLMAdaptError", "MLMDataModule", "MaskedLMModule", "Segmenter", "WholeWordMaskCollator"]
__version__ = "0.1.0"
