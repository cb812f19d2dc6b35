"""Module paths of mlm_adapt 0.1 (one flat package), still importable under their old names.

Saved ``training_config.yaml`` files and user configs name classes by module path (e.g.
``mlm_adapt.resume.ExactResume`` in ``trainer.callbacks``, ``mlm_adapt.callbacks.HFExport``); importing such
a path gives the module at its new home, the same object, so ``isinstance`` checks and pickles agree.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

MOVED_MODULES = {
    "mlm_adapt.callbacks": "mlm_adapt.export.callback",
    "mlm_adapt.checkpoints": "mlm_adapt.model.checkpoints",
    "mlm_adapt.corpus": "mlm_adapt.text.corpus",
    "mlm_adapt.hub": "mlm_adapt.export.hub",
    "mlm_adapt.metrics": "mlm_adapt.model.metrics",
    "mlm_adapt.resume": "mlm_adapt.training.resume",
    "mlm_adapt.scale": "mlm_adapt.training.scale",
    "mlm_adapt.segment": "mlm_adapt.text.segment",
    "mlm_adapt.throughput": "mlm_adapt.model.throughput",
    "mlm_adapt.tiny": "mlm_adapt.model.tiny",
    "mlm_adapt.units": "mlm_adapt.masking.units",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the target module is already imported."""


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Resolves the 0.1 module names of :data:`MOVED_MODULES` to their current modules."""

    def find_spec(
        self, fullname: str, path: object, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        moved = MOVED_MODULES.get(fullname)
        return importlib.util.spec_from_loader(fullname, _Alias(moved)) if moved else None


def install() -> None:
    """Adds the finder once (idempotent)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
