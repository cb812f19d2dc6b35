"""mlm_adapt: domain-adaptive whole-word-masking MLM pretraining of Chinese BERT-family models (the packages
and their layers: docs/architecture.md).

The public names below are imported on first use: ``python -m mlm_adapt --help`` (which imports this
package first) and the light commands do not pay for torch, Lightning and transformers."""

from __future__ import annotations

from mlm_adapt.lazy_exports import lazy_exports

# Public name -> the module that defines it.
_EXPORTS = {
    "MLMAdaptError": "mlm_adapt.errors",
    "MLMDataModule": "mlm_adapt.data",
    "MaskedLMModule": "mlm_adapt.model",
    "JiebaSegmenter": "mlm_adapt.text.segmentation",
    "WholeWordMaskCollator": "mlm_adapt.masking",
    # The data module's option groups (a mapping of their options is accepted too).
    "SegmentationOptions": "mlm_adapt.text.segmentation",
    "MaskingOptions": "mlm_adapt.masking.options",
    "BlockOptions": "mlm_adapt.text.blocks",
    "ReplayOptions": "mlm_adapt.data.replay",
    "StreamingOptions": "mlm_adapt.data.streaming",
    "ForgettingOptions": "mlm_adapt.data.forgetting",
}
__all__ = sorted(_EXPORTS)
__version__ = "0.3.0"


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
