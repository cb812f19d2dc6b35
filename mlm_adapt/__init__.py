"""mlm_adapt: domain-adaptive whole-word-masking MLM pretraining of Chinese BERT-family models.

The packages follow the data flow, each importing only those before it:
``text`` (corpus -> words -> tokens with word ids -> blocks) -> ``masking`` -> ``data`` (the DataModule) ->
``model`` (the LightningModule, metrics, checkpoints) -> ``training`` (callbacks) -> ``export`` -> ``cli``.
"""

from mlm_adapt.data import MLMDataModule
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.masking import WholeWordMaskCollator
from mlm_adapt.model import MaskedLMModule
from mlm_adapt.text.segmentation import Segmenter

__all__ = ["MLMAdaptError", "MLMDataModule", "MaskedLMModule", "Segmenter", "WholeWordMaskCollator"]
__version__ = "0.2.0"
