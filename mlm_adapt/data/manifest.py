"""The manifest of a prepared directory: what its blocks depend on, its shape, and its parts' agreement.

The manifest records each setting the blocks depend on as the *content* it depends on (a hash of the
tokenizer's files, not its path): the directory may move, a change that would alter the blocks is refused
as ``old → new``. The manifest is the tool's own file: it is checked by its :data:`FORMAT_VERSION`, not
field by field. A ``prepare --shard i/N`` part also records its task (index and N) and the
fingerprint of the whole corpus and settings it was cut from, so parts renamed, copied from another
directory or left from before a change of the corpus are refused instead of read as one corpus.
See docs/prepare.md.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from transformers import PreTrainedTokenizerBase

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.secrets import withhold
from mlm_adapt.text.tokenizer import read_new_tokens

# 2: document attention and the OpenCC conversion are settings, the test files are recorded.
# 3: a part records the fingerprint of the whole corpus and settings (``part.corpus``).
# 4: the replay files are recorded under ``replay`` (was ``mix``), as the option group is named.
FORMAT_VERSION = 4
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


def schema_dtypes(schema: pa.Schema) -> dict[str, str]:
    """A block schema's element type per column, as a manifest records it."""
    return {field.name: str(field.type.value_type) for field in schema}


def _digest(chunks: list[bytes]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for chunk in chunks:
        digest.update(len(chunk).to_bytes(8, "little") + chunk)
    return digest.hexdigest()


def tokenizer_hash(name_or_path: str, tokenizer: PreTrainedTokenizerBase, added: list[str]) -> str:
    """Hash of a tokenizer: its files when ``name_or_path`` is a directory, else its base vocabulary
    (``added``, the tokens of ``new_tokens_file``, left out: they are recorded on their own)."""
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


def prepared_settings(datamodule: Any) -> dict:
    """The settings a prepared directory's blocks depend on, from an ``MLMDataModule``: its options, its
    tokenizer and its validation sets."""
    hp, tokenizer, sets = datamodule.hparams, datamodule.tokenizer, datamodule.validation_sets
    blocks, segmentation = datamodule.blocks, datamodule.segmentation
    segmenter = datamodule.segmenter  # the setting it was built from (a Python caller's object: its name)
    replay_files = datamodule.replay.files
    added = read_new_tokens(hp.new_tokens_file) if hp.new_tokens_file else []
    added_tokens = {"count": len(added), "hash": _digest([t.encode() for t in added])}
    name = hp.tokenizer_name_or_path
    return {
        "tokenizer": {"name": name, "hash": tokenizer_hash(name, tokenizer, added)},
        "max_seq_length": hp.max_seq_length,
        "packing": blocks.packing,
        "document_attention": blocks.document_attention and blocks.packing,
        # A secret init argument (an API key) sets no word: not recorded, and rotating it is no change.
        "segmenter": {"backend": withhold(segmenter.spec or segmenter.name), "hmm": segmentation.hmm},
        "opencc": segmentation.opencc,
        "user_dict": file_hash(segmentation.user_dict),
        "added_tokens": added_tokens if added else None,
        "validation_sets": list(sets.names),
        # The held-out split is drawn with the seed: another seed means other blocks.
        "held_out_split": {"fraction": hp.validation_split, "seed": datamodule.seed}
        if sets.held_out_split
        else None,
        # General text for replay is its own split (``mix``); the rate is drawn at sampling time.
        "replay": {"files": [Path(f).name for f in replay_files]} if replay_files else None,
    }


def test_files_record(files: list[str] | None) -> list[dict] | None:
    """What the test split was built from: each file's name and content hash (``None``: no test split)."""
    return [{"name": Path(f).name, "hash": file_hash(f)} for f in files] if files else None


def _shown(key: str, value: Any) -> str:
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
        tokenizers = key == "tokenizer" and isinstance(old, dict) and isinstance(value, dict)
        if (old.get("hash") != value.get("hash")) if tokenizers else old != value:
            conflicts.append(f"{key} {_shown(key, old)} → {_shown(key, value)}")
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
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if version != FORMAT_VERSION:
        raise MLMAdaptError(
            f"data.prepared_dir: {path} has format version {version}, this mlm_adapt reads {FORMAT_VERSION}; "
            f"{hint}"
        )
    return manifest


def write_manifest(directory: Path, manifest: dict) -> None:
    """Writes ``manifest.json`` into a staging directory of ``write_directory`` (which fsyncs it)."""
    text = json.dumps(manifest, ensure_ascii=False, indent=2, sort_keys=True)
    (directory / MANIFEST).write_text(text, encoding="utf-8")


def checked_manifest(path: Path, settings: dict) -> dict:
    """The manifest of a prepared directory (or part) whose settings are ``settings``, else refused."""
    manifest = read_manifest(path)
    conflicts = setting_conflicts(manifest.get("settings") or {}, settings)
    if conflicts:
        raise MLMAdaptError(
            f"data.prepared_dir: {path} was prepared with other settings: {'; '.join(conflicts)}; set them "
            "back or run prepare again into a new directory"
        )
    return manifest


def part_record(index: int, count: int, documents: str, settings: dict, test_files: list | None) -> dict:
    """A part's ``part`` entry: its task ``index`` of ``count`` and the fingerprint of the whole corpus
    (``documents``, :func:`~mlm_adapt.data.corpus_statistics.documents_fingerprint`) and settings."""
    whole = {"documents": documents, "settings": settings, "test_files": test_files}
    corpus = _digest([json.dumps(whole, ensure_ascii=False, sort_keys=True).encode()])
    return {"index": index, "count": count, "corpus": corpus}


def check_part(path: Path, manifest: dict, index: int, count: int) -> None:
    """Refuses the part at ``path`` (the directory of task ``index`` of ``count``) when its manifest is
    another task's: a part renamed or copied over another, or a one-process prepare moved in."""
    part = manifest.get("part")
    held = f"task {part['index']} of {part['count']}" if part else "a one-process prepare (no part record)"
    if part is None or (part["index"], part["count"]) != (index, count):
        raise MLMAdaptError(
            f"data.prepared_dir: {path} holds {held} (its {MANIFEST}), not task {index} of {count}: a part "
            f"was renamed or copied; remove {path.name} and run task {index} of the prepare again"
        )


def check_parts(paths: list[Path], manifests: list[dict]) -> None:
    """Refuses, naming the part, parts that are not the tasks their names say or that were cut from
    another corpus (or settings) than the others: read together they would be no one corpus's blocks."""
    for index, (path, manifest) in enumerate(zip(paths, manifests, strict=True)):
        check_part(path, manifest, index, len(paths))
    corpora = [manifest["part"]["corpus"] for manifest in manifests]
    counted = Counter(corpora)
    # The corpus of most parts (the first part's on a tie) is the reference; the first other part is named.
    common = max(corpora, key=lambda corpus: (counted[corpus], -corpora.index(corpus)))
    odd = next((i for i, corpus in enumerate(corpora) if corpus != common), None)
    if odd is not None:
        reference = paths[corpora.index(common)].name
        raise MLMAdaptError(
            f"data.prepared_dir: {paths[odd]} was cut from another corpus than {reference} (corpus "
            f"fingerprint {corpora[odd][:12]}, not {common[:12]}): the tasks read different corpora or the "
            "corpus changed between them; run every task again with one corpus (a task whose part is of it "
            "keeps it)"
        )
