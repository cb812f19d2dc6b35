"""Finding the checkpoint ``--ckpt_path last`` resumes, and the settings a checkpoint fixes."""

from __future__ import annotations

import os
from pathlib import Path

from mlm_adapt.training.resume_lookup import (
    conflict_message,
    find_last_checkpoint,
    resume_conflicts,
    version_of,
)


def touch(path: Path, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"ckpt")
    os.utime(path, (mtime, mtime))
    return path


def test_newest_last_checkpoint_across_versions(tmp_path):
    root = tmp_path / "runs" / "demo" / "csv"
    touch(root / "version_0" / "checkpoints" / "last.ckpt", 1000)
    newest = touch(root / "version_1" / "checkpoints" / "last-v1.ckpt", 3000)
    touch(root / "version_1" / "checkpoints" / "step900-val_loss6.5.ckpt", 4000)  # not a last checkpoint
    touch(root / "version_2" / "checkpoints" / ".last.ckpt.x1y2.tmp", 5000)  # a killed write
    (root / "version_3").mkdir()  # the version a fresh run would start: empty
    assert find_last_checkpoint([root]) == newest
    assert version_of(newest, root) == "version_1"


def test_fixed_checkpoint_directory_and_none(tmp_path):
    fixed = tmp_path / "checkpoints"
    assert find_last_checkpoint([tmp_path / "csv"], [fixed]) is None
    last = touch(fixed / "last.ckpt", 2000)
    assert find_last_checkpoint([tmp_path / "csv"], [fixed]) == last
    assert version_of(last, tmp_path / "csv") is None  # not in a logger version: loggers keep theirs


def test_changed_fixed_settings_are_listed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny-bert").mkdir()
    saved = {
        "model": {"model_name_or_path": "tiny-bert", "max_seq_length": 128, "warmup": 0.1},
        "data": {"batch_size": 32, "tokenizer_name_or_path": "tiny-bert"},
        "corpus": {"corpus_fingerprint": "a" * 32},
    }
    same = {
        "model": {"model_name_or_path": "./tiny-bert", "max_seq_length": 128, "warmup": 0.2},
        "data": {"batch_size": 32, "tokenizer_name_or_path": str(tmp_path / "tiny-bert")},
        "corpus": {"corpus_fingerprint": "a" * 32},
    }
    assert resume_conflicts(saved, same) == []  # the same directory spelled otherwise; warmup may change
    changed = {
        "model": {"model_name_or_path": "tiny-bert", "max_seq_length": 64},
        "data": {"batch_size": 16, "tokenizer_name_or_path": "tiny-bert"},
        "corpus": {"corpus_fingerprint": "b" * 32},
    }
    conflicts = resume_conflicts(saved, changed)
    assert conflicts == [
        "model.max_seq_length: 128 -> 64",
        "data.batch_size: 32 -> 16",
        "training corpus: fingerprint aaaaaaaaaaaa -> bbbbbbbbbbbb",
    ]
    message = conflict_message("runs/last.ckpt", conflicts)
    assert "\n" not in message and "model.max_seq_length: 128 -> 64" in message


def test_checkpoint_without_fingerprint_is_compared_on_what_it_has():
    old = {"model": {"max_seq_length": 64}, "data": {"batch_size": 8}}  # mlm_adapt 0.1
    new = {"model": {"max_seq_length": 64}, "data": {"batch_size": 8}, "corpus": {"corpus_fingerprint": "c"}}
    assert resume_conflicts(old, new) == []
