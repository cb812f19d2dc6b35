"""The manifest of a prepared directory: the settings its blocks depend on, compared at every load.

A prepared directory holds token ids, so it is only valid for the tokenizer, block length, packing,
segmenter, user dictionary and added tokens it was built with. Each is recorded here as the *content* it
depends on (a hash of the tokenizer's files, not its path), so the directory can move to another machine or
the tokenizer to another path, while any change that would alter the blocks is refused with one line
naming ``old → new``.

A manifest is data a user may have copied across clusters, edited or half-synced, so it is read as
untrusted: :func:`check_manifest` checks its whole shape (every key, type and count, and that the splits it
names are there) before anything is opened, and names the first key that is wrong.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.tokenizer import read_new_tokens

# 2: document attention and the OpenCC conversion are settings, the test files are recorded.
FORMAT_VERSION = 2
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
        "document_attention": bool(hparams.get("document_attention")) and hparams["packing"],
        "segmenter": {"backend": hparams["segmenter"], "hmm": hparams["hmm"]},
        "opencc": hparams.get("opencc"),
        "user_dict": file_hash(hparams.get("user_dict")),
        "added_tokens": {"count": len(added), "hash": _digest([t.encode() for t in added])}
        if added
        else None,
        "validation_sets": list(set_names),
        # The held-out split is drawn with the seed: another seed means other blocks.
        "held_out_split": {"fraction": hparams["validation_split"], "seed": hparams["seed"]}
        if held_out
        else None,
        # General text for replay is its own split (``mix``); the rate is drawn at sampling time.
        "mix": {"files": [Path(f).name for f in hparams["mix_files"]]} if hparams.get("mix_files") else None,
    }


def test_files_record(files: list[str] | None) -> list[dict] | None:
    """What the test split was built from: each file's name and content hash (``None``: no test split)."""
    if not files:
        return None
    return [{"name": Path(f).name, "hash": file_hash(f)} for f in files]


def _validation_files(files: Any) -> list:
    if isinstance(files, dict):
        return list(files.values())
    return [files or None]


def _shown(key: str, value: Any) -> str:
    if not isinstance(value, dict | str | None):  # a hand-edited value of another type
        return json.dumps(value, ensure_ascii=False)
    if key == "tokenizer" and isinstance(value, dict):
        return f"{value['name']} (files {value['hash'][:12]})"
    if key == "added_tokens" and isinstance(value, dict):
        return f"{value.get('count')} tokens ({str(value.get('hash'))[:12]})"
    if key == "user_dict" and isinstance(value, str):
        return f"file {value[:12]}"
    if value is None:
        return "none"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return json.dumps(value, ensure_ascii=False)


def setting_conflicts(saved: dict, current: dict) -> list[str]:
    """``key: old → new`` for every setting that differs (a moved tokenizer with equal files does not)."""
    conflicts = []
    for key, value in current.items():
        old = saved.get(key)
        # A moved tokenizer with the same files is the same tokenizer.
        tokenizers = key == "tokenizer" and isinstance(old, dict) and isinstance(value, dict)
        same = old.get("hash") == value.get("hash") if tokenizers else old == value
        if not same:
            was = _shown(key, old) if old is not None else "none"
            conflicts.append(f"{key} {was} → {_shown(key, value)}")
    return conflicts


class _Count:
    """Schema marker: a non-negative integer."""


# The shape of a manifest: a dict maps keys to the shape of their values ("?" marks an optional key), a
# one-element list is a list of that shape, ``_Count`` a non-negative integer, a type that type.
_SHARD = {"file": str, "blocks": _Count, "bytes": _Count}
_SPLIT = {"shards": [_SHARD], "documents": _Count, "blocks": _Count, "tokens": _Count, "characters": _Count}
_MANIFEST = {
    "format_version": int,
    "settings": dict,
    "validation_sets": dict,
    "dtypes": {"input_ids": str, "word_ids": str},
    "corpus_fingerprint": str,
    "splits": dict,
    "test_files?": (list, type(None)),
    "part?": {"index": _Count, "count": _Count},
}


def _shape_error(value: Any, shape: Any, key: str) -> str | None:
    """Where ``value`` departs from ``shape`` (``key`` is its dotted path), or ``None``."""
    if shape is _Count:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else f"{key} is {json.dumps(value)[:40]} where a count (integer >= 0) belongs"
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{key} is a {type(value).__name__} where a mapping belongs"
        for name, inner in shape.items():
            optional, name = name.endswith("?"), name.rstrip("?")
            if name not in value:
                if optional:
                    continue
                return f"{key}.{name} is missing"
            if error := _shape_error(value[name], inner, f"{key}.{name}"):
                return error
        return None
    if isinstance(shape, list):
        if not isinstance(value, list) or not value:
            return f"{key} is {json.dumps(value)[:40]} where a non-empty list belongs"
        return next((e for i, v in enumerate(value) if (e := _shape_error(v, shape[0], f"{key}[{i}]"))), None)
    if isinstance(value, shape) and not (isinstance(value, bool) and shape is int):
        return None
    return f"{key} is a {type(value).__name__}, not the {getattr(shape, '__name__', 'value')} it should be"


def check_manifest(manifest: Any, path: Path) -> dict:
    """``manifest`` if it has the whole shape :func:`write_manifest` gives it, else one line naming the key.

    Checks every key and type, every split entry and shard entry, that the block counts of the shards add up
    to their split's, and that the train split, the validation split and every split that
    ``validation_sets`` names are there.
    """
    splits = manifest.get("splits") if isinstance(manifest, dict) else None
    error = _shape_error(manifest, _MANIFEST, "manifest")
    if error is None:
        error = next((e for n, v in splits.items() if (e := _shape_error(v, _SPLIT, f"splits.{n}"))), None)
    if error is None:
        named = manifest["validation_sets"]
        wanted = ["train", "validation", *(v for v in named.values() if isinstance(v, str))]
        missing = [split for split in wanted if split not in splits]
        if missing or not all(isinstance(v, str) for v in named.values()):
            error = f"splits has no {missing[0]!r} split" if missing else "validation_sets holds a non-name"
    if error is None:
        for name, split in splits.items():
            listed = sum(shard["blocks"] for shard in split["shards"])
            if listed != split["blocks"]:
                error = f"splits.{name} counts {split['blocks']} blocks but its shards list {listed}"
                break
    if error:
        raise MLMAdaptError(
            f"data.prepared_dir: {path}: {error.removeprefix('manifest.')}; the directory was altered or "
            "copied in part: copy it again whole or run prepare again"
        )
    return manifest


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
    return check_manifest(manifest, path)


def write_manifest(directory: Path, manifest: dict) -> None:
    """Writes ``manifest.json`` into a staging directory of ``write_directory`` (which fsyncs it)."""
    text = json.dumps(manifest, ensure_ascii=False, indent=2, sort_keys=True)
    (directory / MANIFEST).write_text(text, encoding="utf-8")
