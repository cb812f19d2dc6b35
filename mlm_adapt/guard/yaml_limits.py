"""YAML the CLI loads (``--config`` files, YAML values): bounded in size and in what its aliases expand to,
since every copy or walk of a value (jsonargparse's validation, ``deepcopy``, the dump into
``config.yaml``) expands them. Light (PyYAML only): the CLI installs the bound before any heavy import."""

from __future__ import annotations

import yaml

from mlm_adapt.errors import MLMAdaptError

# Far above any real config (the shipped ones have a few hundred nodes), far below what exhausts memory.
MAX_EXPANDED_NODES = 1_000_000
MAX_YAML_BYTES = 16 * 1024 * 1024


def check_yaml_expansion(text: str, source: str = "a --config file or YAML value") -> None:
    """Refuses YAML over :data:`MAX_YAML_BYTES`, or whose aliases expand to over :data:`MAX_EXPANDED_NODES`
    values (counted on the composed node graph, one visit per distinct node)."""
    if len(text) > MAX_YAML_BYTES:
        raise MLMAdaptError(
            f"{source}: {len(text)} characters of YAML (the limit is {MAX_YAML_BYTES}); configs are smaller"
        )
    if "*" not in text:  # no alias: its size is its length
        return
    try:
        nodes = [node for node in yaml.compose_all(text, Loader=yaml.SafeLoader) if node is not None]
    except yaml.YAMLError:
        return  # not valid YAML: the loader reports it
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        if id(node) not in sizes:
            sizes[id(node)] = 1  # a recursive alias counts once, as PyYAML builds it (a cycle, not a copy)
            children = node.value if isinstance(node, yaml.SequenceNode) else []
            if isinstance(node, yaml.MappingNode):
                children = [child for pair in node.value for child in pair]
            sizes[id(node)] = 1 + sum(size(child) for child in children)
        return sizes[id(node)]

    total = sum(size(node) for node in nodes)
    if total > MAX_EXPANDED_NODES:
        raise MLMAdaptError(
            f"{source}: its YAML aliases expand to {total} values (the limit is {MAX_EXPANDED_NODES}): "
            "an alias bomb; write the values out instead of nesting aliases"
        )
