"""Typed option groups: ``data.segmentation``, ``data.masking``, ``data.blocks``, ``data.replay``,
``data.streaming`` and ``forgetting``. Each is a frozen dataclass whose docstring is its ``--help`` and whose
``check()`` refuses, in one line naming the key, a value it could not act on. The parser builds a group to
check its types; :func:`as_options` checks the values where the group is taken into use (the parser's report
of a failure inside a constructor would not be one line). Checkpoints and manifests keep a group as the
plain mapping :func:`plain` gives, and :func:`as_options` turns it back into the group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Protocol, TypeVar

from mlm_adapt.errors import MLMAdaptError


class OptionGroup(Protocol):
    """A frozen dataclass of options with its checks."""

    def check(self) -> Any:
        """Refuses a value the group cannot act on (one line naming the key); returns the group."""


Group = TypeVar("Group", bound=OptionGroup)


def as_options(group: type[Group], value: Group | Mapping[str, Any] | None, key: str) -> Group:
    """The checked options of ``group`` (given as option ``key``) from what a caller gave: the options, their
    mapping (a config's, a checkpoint's hyper-parameters, a Python caller's) or ``None`` (the defaults)."""
    if value is None:
        return group().check()
    if isinstance(value, group):
        return value.check()
    names = [f.name for f in fields(group)]  # type: ignore[arg-type]
    if not isinstance(value, Mapping):
        raise MLMAdaptError(f"{key}={value!r} is not a mapping of {', '.join(names)}")
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise MLMAdaptError(f"{key}.{unknown[0]} is no option; use {', '.join(names)}")
    return group(**value).check()


def option_value(values: Any, key: str, default: Any = None) -> Any:
    """The value of option ``key`` (``batch_size``, or a group's ``replay.files``) in ``values``: a data
    module's hyper-parameters, a checkpoint's, or a parsed config's namespace; ``default`` where it has
    none."""
    for part in key.split("."):
        if not hasattr(values, "get"):
            return default
        values = values.get(part, default)
    return values


def plain(options: OptionGroup) -> dict[str, Any]:
    """The options as plain values (hyper-parameters, checkpoints, manifests)."""
    return {f.name: getattr(options, f.name) for f in fields(options)}  # type: ignore[arg-type]
