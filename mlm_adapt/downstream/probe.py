"""The linear probe: multinomial logistic regression on frozen features, trained to convergence.

Full-batch L-BFGS with a strong-Wolfe line search on the L2-regularized cross-entropy: the problem is convex,
so the result depends on the features only (no seed, no learning rate, no epoch count to tune), which is
what makes probe scores of two checkpoints comparable.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class LinearProbe:
    """Standardizes features (train statistics) and fits ``softmax(x W + b)``.

    Args:
        l2: Weight of ``0.5 * ||W||^2`` added to the mean cross-entropy (the bias is not penalized).
        max_iter: L-BFGS iterations at most; it stops earlier when the gradient or loss change vanishes.
        tolerance: Gradient tolerance (max absolute component) that counts as converged.
    """

    def __init__(self, l2: float = 1e-3, max_iter: int = 500, tolerance: float = 1e-6):
        self.l2 = l2
        self.max_iter = max_iter
        self.tolerance = tolerance
        self.mean: torch.Tensor | None = None
        self.scale: torch.Tensor | None = None
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self.iterations = 0

    def _standardize(self, x: torch.Tensor) -> torch.Tensor:
        return (x.double() - self.mean) / self.scale

    def fit(self, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> LinearProbe:
        """Fits the probe on features ``x`` ``[n, dim]`` and class indices ``y`` ``[n]``."""
        # float64: L-BFGS converges to the same optimum in far fewer, more reproducible iterations.
        self.mean = x.double().mean(0)
        self.scale = x.double().std(0).clamp(min=1e-6)
        z = self._standardize(x)
        y = y.long()
        weight = torch.zeros(z.shape[1], num_classes, dtype=torch.float64, requires_grad=True)
        bias = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.LBFGS(
            [weight, bias],
            lr=1.0,
            max_iter=self.max_iter,
            tolerance_grad=self.tolerance,
            tolerance_change=1e-12,
            history_size=20,
            line_search_fn="strong_wolfe",
        )

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = F.cross_entropy(z @ weight + bias, y) + 0.5 * self.l2 * weight.pow(2).sum()
            loss.backward()
            return loss

        with torch.enable_grad():
            optimizer.step(closure)
        self.iterations = optimizer.state[optimizer._params[0]]["n_iter"]
        self.weight, self.bias = weight.detach(), bias.detach()
        return self

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Class index of each row of ``x``."""
        if self.weight is None:
            raise RuntimeError("LinearProbe.predict before fit")
        return (self._standardize(x) @ self.weight + self.bias).argmax(-1)
