"""YAML with bounded expansion: a config whose aliases expand without limit ("billion laughs") is refused.

PyYAML builds an alias as a shared reference, so loading a bomb is cheap; what grows without bound is every
later copy or walk of the value (jsonargparse's validation, ``deepcopy``, the dump into ``config.yaml``). The
document's node graph is composed first -- aliases stay shared there -- and its expanded size counted with
one visit per distinct node; a document over :data:`MAX_EXPANDED_NODES` (or :data:`MAX_YAML_BYTES`) is one
line instead of a run that fills the memory.
"""

from __future__ import annotations

from typing import Any

import yaml

from mlm_adapt.errors import MLMAdaptError

# Far above any real config (the shipped ones have a few hundred nodes), far below what exhausts memory.
MAX_EXPANDED_NODES = 1_000_000
MAX_YAML_BYTES = 16 * 1024 * 1024


def expanded_size(node: yaml.Node, memo: dict[int, int] | None = None) -> int:
    """The number of nodes of ``node`` with every alias expanded (counted, not built)."""
    memo = {} if memo is None else memo
    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = 1  # a recursive alias counts once, as PyYAML builds it (a cycle, not a copy)
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(expanded_size(child, memo) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        total += sum(expanded_size(k, memo) + expanded_size(v, memo) for k, v in node.value)
    memo[id(node)] = total
    return total


def check_yaml_expansion(text: str, source: str = "a --config file or YAML value") -> None:
    """Refuses YAML text over :data:`MAX_YAML_BYTES` or whose aliases expand to over
    :data:`MAX_EXPANDED_NODES` nodes.

    Args:
        text: The YAML document(s).
        source: What the text came from, for the message.
    """
    if len(text) > MAX_YAML_BYTES:
        raise MLMAdaptError(
            f"{source}: {len(text)} characters of YAML (the limit is {MAX_YAML_BYTES}); configs are smaller"
        )
    if "*" not in text:  # no alias: its size is its length
        return
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        return  # not valid YAML: the loader reports it
    memo: dict[int, int] = {}
    size = sum(expanded_size(node, memo) for node in nodes if node is not None)
    if size > MAX_EXPANDED_NODES:
        raise MLMAdaptError(
            f"{source}: its YAML aliases expand to {size} values (the limit is {MAX_EXPANDED_NODES}): "
            "an alias bomb; write the values out instead of nesting aliases"
        )


def bounded_loader(load: Any) -> Any:
    """``load`` (a ``str -> value`` YAML loader, e.g. jsonargparse's) behind :func:`check_yaml_expansion`."""

    def load_bounded(text: str) -> Any:
        if isinstance(text, str):
            check_yaml_expansion(text)
        return load(text)

    load_bounded.bounded = True  # type: ignore[attr-defined]
    return load_bounded
