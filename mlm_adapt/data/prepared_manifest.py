"""The manifest of a prepared directory: the settings its blocks depend on, compared at every load.

A prepared directory holds token ids, so it is only valid for the tokenizer, block length, packing,
segmenter, user dictionary and added tokens it was built with. Each is recorded here as the *content* it
depends on (a hash of the tokenizer's files, not its path), so the directory can move to another machine or
the tokenizer to another path, while any change that would alter the blocks is refused with one line
naming ``old → new``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.tokenizer import read_new_tokens

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
# The tokenizer files that decide tokenization (model weights and configs do not).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)


def _digest(chunks: list[bytes]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for chunk in chunks:
        digest.update(len(chunk).to_bytes(8, "little") + chunk)
    return digest.hexdigest()


def tokenizer_hash(name_or_path: str, tokenizer: PreTrainedTokenizerBase, added: list[str]) -> str:
    """Hash of a tokenizer: its files when ``name_or_path`` is a directory, else its base vocabulary.

    Args:
        name_or_path: The tokenizer's directory or Hub name.
        tokenizer: The loaded tokenizer (with ``added`` tokens).
        added: Tokens added from ``new_tokens_file`` (left out: they are recorded on their own).
    """
    directory = Path(name_or_path)
    if directory.is_dir():
        files = [directory / n for n in TOKENIZER_FILES if (directory / n).is_file()]
        return _digest([p.name.encode() + b"\0" + p.read_bytes() for p in files])
    extra = set(added)
    vocab = sorted((t, i) for t, i in tokenizer.get_vocab().items() if t not in extra)
    return _digest([json.dumps(vocab, ensure_ascii=False).encode()])


def file_hash(path: str | None) -> str | None:
    """Hash of a file's bytes (``None`` for no file)."""
    return _digest([Path(path).read_bytes()]) if path else None


def prepared_settings(hparams: Any, tokenizer: PreTrainedTokenizerBase, set_names: list[str]) -> dict:
    """The settings a prepared directory's blocks depend on, from an ``MLMDataModule``'s hyper-parameters.

    Args:
        hparams: The DataModule's hyper-parameters.
        tokenizer: Its tokenizer (``new_tokens_file`` tokens added).
        set_names: Names of the validation sets, the primary one first.
    """
    added = read_new_tokens(hparams["new_tokens_file"]) if hparams.get("new_tokens_file") else []
    name = hparams["tokenizer_name_or_path"]
    held_out = any(files is None for files in _validation_files(hparams.get("validation_files")))
    return {
        "tokenizer": {"name": name, "hash": tokenizer_hash(name, tokenizer, added)},
        "max_seq_length": hparams["max_seq_length"],
        "packing": hparams["packing"],
        "segmenter": {"backend": hparams["segmenter"], "hmm": hparams["hmm"]},
        "user_dict": file_hash(hparams.get("user_dict")),
        "added_tokens": {"count": len(added), "hash": _digest([t.encode() for t in added])}
        if added
        else None,
        "validation_sets": list(set_names),
        # The held-out split and the mixing are drawn with the seed: another seed means other blocks.
        "held_out_split": {"fraction": hparams["validation_split"], "seed": hparams["seed"]}
        if held_out
        else None,
        "mix": (
            {"probability": hparams["mix_probability"], "seed": hparams["seed"]}
            if hparams.get("mix_probability")
            else None
        ),
    }


def _validation_files(files: Any) -> list:
    if isinstance(files, dict):
        return list(files.values())
    return [files or None]


def _shown(key: str, value: Any) -> str:
    if key == "tokenizer":
        return f"{value['name']} (files {value['hash'][:12]})"
    if key == "added_tokens":
        return "none" if value is None else f"{value['count']} tokens ({value['hash'][:12]})"
    if key == "user_dict":
        return "none" if value is None else f"file {value[:12]}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return json.dumps(value, ensure_ascii=False)


def setting_conflicts(saved: dict, current: dict) -> list[str]:
    """``key: old → new`` for every setting that differs (a moved tokenizer with equal files does not)."""
    conflicts = []
    for key, value in current.items():
        old = saved.get(key)
        # A moved tokenizer with the same files is the same tokenizer.
        same = old.get("hash") == value.get("hash") if key == "tokenizer" and old and value else old == value
        if not same:
            was = _shown(key, old) if old is not None else "none"
            conflicts.append(f"{key} {was} → {_shown(key, value)}")
    return conflicts


def read_manifest(directory: Path) -> dict:
    """The manifest of a complete prepared directory; a missing or foreign one is refused in one line."""
    path = directory / MANIFEST
    hint = f"run `python -m mlm_adapt prepare --config CONFIG --data.prepared_dir {directory}` first"
    if not directory.is_dir():
        raise MLMAdaptError(f"data.prepared_dir: {directory} does not exist; {hint}")
    if not path.is_file():
        raise MLMAdaptError(
            f"data.prepared_dir: {directory} has no {MANIFEST} (not a prepared directory, or an interrupted "
            f"prepare); {hint}"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MLMAdaptError(f"data.prepared_dir: {path} is unreadable ({exc}); {hint}") from None
    if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
        version = manifest.get("format_version") if isinstance(manifest, dict) else None
        raise MLMAdaptError(
            f"data.prepared_dir: {path} has format version {version}, this mlm_adapt reads {FORMAT_VERSION}; "
            f"{hint}"
        )
    return manifest


def write_manifest(directory: Path, manifest: dict) -> None:
    """Writes ``manifest.json`` durably (flushed to disk before the directory is renamed into place)."""
    path = directory / MANIFEST
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, ensure_ascii=False, indent=2, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
