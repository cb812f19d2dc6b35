"""Moved to :mod:`mlm_adapt.guard.loads` (every file the tool loads); the names stay importable here."""

from __future__ import annotations

from mlm_adapt.guard.loads import (
    ALLOWED_GLOBALS,
    check_sharded_metadata,
    load_sharded,
    load_weights_only,
)

__all__ = ["ALLOWED_GLOBALS", "check_sharded_metadata", "load_sharded", "load_weights_only"]
