"""Model: the masked-LM LightningModule, its loading, metrics, throughput and checkpoint reading."""

from mlm_adapt.model.module import MaskedLMModule, default_optimizer

__all__ = ["MaskedLMModule", "default_optimizer"]
