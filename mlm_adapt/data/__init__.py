"""Data: the LightningDataModule over in-memory or streamed corpora, its samplers and preprocessing."""

from mlm_adapt.data.datamodule import MLMDataModule

__all__ = ["MLMDataModule"]
