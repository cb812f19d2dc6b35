"""Loading the model's tokenizer, optionally extended with new tokens (``model.new_tokens_file``).

New tokens are appended to the tokenizer; :func:`mlm_adapt.model.loading.extend_embeddings` gives each new
embedding row the mean of the embeddings of the pieces the old tokenizer split the token into.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.loads import pretrained_tokenizer


def read_new_tokens(path: str | Path) -> list[str]:
    """Reads a new-tokens file: one token per line (blank lines and duplicates ignored), UTF-8."""
    path = Path(path)
    if not path.is_file():
        raise MLMAdaptError(
            f"model.new_tokens_file: {path} does not exist; give a file with one token per line"
        )
    tokens = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return list(dict.fromkeys(t for t in tokens if t))


def extend_tokenizer(tokenizer: PreTrainedTokenizerBase, tokens: Sequence[str]) -> list[str]:
    """Adds the tokens missing from ``tokenizer``'s vocabulary, in order; returns those added."""
    vocab = tokenizer.get_vocab()
    new = [t for t in tokens if t not in vocab]
    tokenizer.add_tokens(new)
    return new


def load_tokenizer(
    name_or_path: str, new_tokens_file: str | None = None, key: str = "model.model_name_or_path"
) -> PreTrainedTokenizerBase:
    """The tokenizer of a model (Hub name or directory), extended with ``new_tokens_file`` when given.

    Every place that needs a run's tokenizer (data, model, export, fill-mask) goes through here, so a
    tokenizer is never paired with a model whose vocabulary was resized for new tokens it lacks.

    Args:
        name_or_path: Hub name or local directory of the model or tokenizer.
        new_tokens_file: Tokens added to the vocabulary, one per line (``model.new_tokens_file``).
        key: The option that named ``name_or_path``, for error messages.
    """
    tokenizer = pretrained_tokenizer(name_or_path, key)
    if new_tokens_file:
        extend_tokenizer(tokenizer, read_new_tokens(new_tokens_file))
    return tokenizer
