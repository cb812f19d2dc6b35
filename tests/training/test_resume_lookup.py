"""Finding the checkpoint ``--ckpt_path last`` resumes, and the settings a checkpoint fixes."""

from __future__ import annotations

import os
from pathlib import Path

from jsonargparse import Namespace

from mlm_adapt.training.checkpoint_files import find_last_checkpoint, resolve_resume, version_of
from mlm_adapt.training.resume import conflict_message, resume_conflicts


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


def test_optimizer_change_is_listed_by_the_changed_argument():
    adam = {"class_path": "torch.optim.AdamW", "init_args": {"lr": 1e-3, "betas": [0.9, 0.999]}}
    same = {"class_path": "torch.optim.AdamW", "init_args": {"lr": 1e-3, "betas": (0.9, 0.999)}}
    faster = {"class_path": "torch.optim.AdamW", "init_args": {"lr": 5e-3, "betas": [0.9, 0.999]}}
    assert resume_conflicts({"model": {"optimizer": adam}}, {"model": {"optimizer": same}}) == []
    assert resume_conflicts({"model": {"optimizer": adam}}, {"model": {"optimizer": faster}}) == [
        "model.optimizer.init_args.lr: 0.001 -> 0.005"
    ]


def fit_config(tmp_path: Path, ckpt_path: str, **checkpoint_args) -> Namespace:
    """The parts of a parsed ``fit`` config that resolve_resume reads, laid out as configs/domain.yaml."""
    loggers = [
        Namespace(
            class_path=f"lightning.pytorch.loggers.{cls}",
            init_args=Namespace(save_dir=str(tmp_path / "runs"), name=name, version=None),
        )
        for cls, name in (("TensorBoardLogger", "tensorboard"), ("CSVLogger", "csv"))
    ]
    callback = Namespace(
        class_path="lightning.pytorch.callbacks.ModelCheckpoint", init_args=Namespace(**checkpoint_args)
    )
    trainer = Namespace(default_root_dir=str(tmp_path / "runs"), logger=loggers, callbacks=[callback])
    return Namespace(ckpt_path=ckpt_path, trainer=trainer)


def test_resolve_last_continues_the_version_of_every_logger(tmp_path):
    runs = tmp_path / "runs"
    touch(runs / "tensorboard" / "version_0" / "checkpoints" / "last.ckpt", 1000)
    last = touch(runs / "tensorboard" / "version_1" / "checkpoints" / "last.ckpt", 2000)
    (runs / "csv" / "version_1").mkdir(parents=True)
    config = fit_config(tmp_path, "last", dirpath=None)
    resolve_resume(config)
    assert config.ckpt_path == str(last)
    assert [logger.init_args.version for logger in config.trainer.logger] == ["version_1", "version_1"]


def test_resolve_last_without_checkpoint_starts_a_new_run(tmp_path):
    config = fit_config(tmp_path, "last", dirpath=str(tmp_path / "fixed"))
    resolve_resume(config)
    assert config.ckpt_path is None
    assert [logger.init_args.version for logger in config.trainer.logger] == [None, None]
    last = touch(tmp_path / "fixed" / "last.ckpt", 1000)  # a fixed dirpath: loggers keep new versions
    config = fit_config(tmp_path, "last", dirpath=str(tmp_path / "fixed"))
    resolve_resume(config)
    assert config.ckpt_path == str(last)
    assert [logger.init_args.version for logger in config.trainer.logger] == [None, None]
