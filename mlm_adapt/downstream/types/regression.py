"""``regression``: one number per text or text pair (STS-style similarity scores, ratings).

Scored by Pearson and Spearman correlation (torchmetrics) with their bootstrap spread; the probe is a ridge
regression on frozen features (closed form, no seed); a fine-tune trains a one-output
``AutoModelForSequenceClassification`` head with ``problem_type: regression`` (mean squared error).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torchmetrics.functional import pearson_corrcoef, spearman_corrcoef
from transformers import PretrainedConfig

from mlm_adapt.downstream.features import Encoding, Place
from mlm_adapt.downstream.scores import Score, bootstrap_std
from mlm_adapt.downstream.spec import DownstreamTask
from mlm_adapt.downstream.types.base import Probe
from mlm_adapt.downstream.types.sequence import SequenceClassification
from mlm_adapt.errors import MLMAdaptError


def correlations(preds: torch.Tensor, gold: torch.Tensor) -> Score:
    """Pearson and Spearman correlation of predictions with the gold numbers (0 when either is constant,
    where correlation is undefined)."""
    preds, gold = preds.double(), gold.double()
    if len(gold) < 2 or preds.std() == 0 or gold.std() == 0:
        return {"pearson": 0.0, "spearman": 0.0}
    return {
        "pearson": float(pearson_corrcoef(preds, gold)),
        "spearman": float(spearman_corrcoef(preds, gold)),
    }


class RidgeProbe:
    """Ridge regression on standardized features and targets, solved exactly (float64).

    Args:
        l2: Weight of ``0.5 * ||w||^2`` added to half the mean squared error (the bias is not penalized).
    """

    def __init__(self, l2: float = 1e-3):
        self.l2 = l2
        self.mean: torch.Tensor | None = None
        self.scale: torch.Tensor | None = None
        self.weight: torch.Tensor | None = None
        self.target_mean = 0.0
        self.target_scale = 1.0

    def fit(self, x: torch.Tensor, y: torch.Tensor, num_labels: int = 0) -> RidgeProbe:
        """Fits ``y ≈ x w + b`` on features ``x`` ``[n, dim]`` and numbers ``y`` ``[n]``."""
        x, y = x.double(), y.double()
        self.mean, self.scale = x.mean(0), x.std(0).clamp(min=1e-6)
        self.target_mean, self.target_scale = float(y.mean()), max(float(y.std()), 1e-12)
        z = (x - self.mean) / self.scale
        t = (y - self.target_mean) / self.target_scale
        gram = z.T @ z / len(z) + self.l2 * torch.eye(z.shape[1], dtype=torch.float64)
        self.weight = torch.linalg.solve(gram, z.T @ t / len(z))
        return self

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """The predicted number of each row of ``x``."""
        if self.weight is None:
            raise RuntimeError("RidgeProbe.predict before fit")
        z = (x.double() - self.mean) / self.scale
        return z @ self.weight * self.target_scale + self.target_mean


class Regression(SequenceClassification):
    """One number per text or text pair."""

    name = "regression"

    def label(self, value: Any, key: str, files: str) -> float:
        try:  # bool is an int to Python, but True is no score
            number = float("nan") if isinstance(value, bool) else float(value)
        except (TypeError, ValueError):
            number = float("nan")
        if not math.isfinite(number):
            raise MLMAdaptError(
                f"{key}: label {value!r} in {files} is not a number; a regression task needs a finite "
                "number per example (use sequence_classification for class names)"
            )
        return number

    def targets(
        self, train: list, test: list, index: int, task: DownstreamTask
    ) -> tuple[list[str], list, list]:
        if len(set(train)) < 2:
            raise MLMAdaptError(
                f"downstream.tasks[{index}].label_column: the training files {', '.join(task.train_files)} "
                f"hold one value only ({train[0]!r}); a regression task needs varied targets"
            )
        return [], list(train), list(test)

    def probe(self, l2: float) -> Probe:
        return RidgeProbe(l2=l2)

    def configure(self, config: PretrainedConfig, label_names: list[str]) -> None:
        config.num_labels = 1
        config.problem_type = "regression"

    def batch_labels(self, encoding: Encoding, rows: list[int], width: int) -> torch.Tensor:
        return torch.tensor([encoding.targets[i] for i in rows], dtype=torch.float32)

    def predictions(self, logits: torch.Tensor, encoding: Encoding, rows: list[int]) -> torch.Tensor:
        return logits[:, 0].float()

    def score(
        self, preds: torch.Tensor, placed: list[Place], gold: list, label_names: list[str], bootstrap: int
    ) -> tuple[Score, Score]:
        target = torch.tensor(gold, dtype=torch.float64)
        preds = preds.double()
        spread = bootstrap_std(len(target), lambda i: correlations(preds[i], target[i]), bootstrap)
        return correlations(preds, target), spread
