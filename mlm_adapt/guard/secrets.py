"""Secrets in the settings: what is withheld from every file an export publishes and every line printed.

A user's class given by ``class_path`` (a cloud word segmenter, a logger) may take a credential as an init
argument. An init argument whose name has a part ``key``, ``token``, ``secret``, ``password``, ``passwd``,
``credential(s)`` or ``auth`` (``api_key``, ``hf_token``, ``clientSecret``) is a secret: its value is
replaced by :data:`WITHHELD` in the model card, ``training_config.yaml`` and the lines the tool prints, and a
change of it does not block a resume. A user marks any other argument so by its name (``endpoint_secret``).
The run's own files (checkpoints, its ``config.yaml``, the logs) keep the values: they are the user's, on
the user's machine, and a resume needs them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

WITHHELD = "<withheld>"
# Where a config holds a class's arguments (jsonargparse: ``init_args``; ``dict_kwargs`` for ``**kwargs``).
ARGS_KEYS = ("init_args", "dict_kwargs")
SECRET_PARTS = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "credential", "credentials", "auth"}
)
# The parts of a name: snake_case, kebab-case, dotted and camelCase words.
_PART = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


def is_secret(name: str) -> bool:
    """Whether an init argument named ``name`` holds a secret (a part of its name is a secret word)."""
    return any(part.lower() in SECRET_PARTS for part in _PART.findall(name))


def withhold(value: Any, in_args: bool = False) -> Any:
    """``value`` (a config, hyper-parameters) with the value of every secret init argument withheld: in each
    ``init_args`` mapping, at any depth (and the plain mappings inside it), the keys that are secrets."""
    if isinstance(value, Mapping):
        args = in_args and "class_path" not in value  # a nested class: only its own init_args
        return {
            key: WITHHELD if args and is_secret(str(key)) else withhold(item, args or key in ARGS_KEYS)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [withhold(item, in_args) for item in value]
    return value


def secret_setting(name: str) -> bool:
    """Whether a dotted setting (``data.segmentation.segmenter.init_args.api_key``) is, or lies in, a secret
    init argument."""
    parts = name.split(".")
    args = [i for i, part in enumerate(parts) if part in ARGS_KEYS]
    return bool(args) and any(is_secret(part) for part in parts[args[0] + 1 :])
