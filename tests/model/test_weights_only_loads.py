"""Checkpoints are loaded without running code from them (weights_only); real Lightning checkpoints load."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy
import pytest
import torch
from conftest import run_cli, tiny_fit_args
from lightning.fabric.strategies.fsdp import _distributed_checkpoint_save
from lightning.fabric.utilities.load import _METADATA_FILENAME

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.loads import load_sharded, load_weights_only


class CreatesMarker:
    """Unpickling this runs code: it creates ``path`` (what an attacker's payload would do instead)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return exec, (f"open({str(self.path)!r}, 'w').close()",)


def crafted_checkpoint(path: Path, marker: Path) -> Path:
    """A file that looks like a Lightning checkpoint and runs code when unpickled."""
    torch.save({"state_dict": {"w": torch.zeros(2)}, "hyper_parameters": {"x": CreatesMarker(marker)}}, path)
    return path


def test_crafted_checkpoint_is_refused_without_running_its_code(tmp_path):
    marker = tmp_path / "pwned"
    evil = crafted_checkpoint(tmp_path / "evil.ckpt", marker)
    refused = r"--ckpt_path: refusing to load .*evil\.ckpt: it needs (builtins\.)?exec"
    with pytest.raises(MLMAdaptError, match=refused):
        load_weights_only(evil)
    assert not marker.exists()
    torch.load(evil, weights_only=False)  # the payload is real: a trusting load runs it
    assert marker.exists()


def test_lightning_checkpoint_of_a_real_run_loads_weights_only(trained_run):
    checkpoint = load_weights_only(trained_run / "checkpoints" / "last.ckpt")
    assert Path(checkpoint["hyper_parameters"]["model_name_or_path"]).name == "tiny-bert"
    assert checkpoint["global_step"] == 6 and checkpoint["mlm_adapt_baseline_metrics"]["val/loss"] > 0
    assert any(k.startswith("model.") for k in checkpoint["state_dict"])


def _truncated(path: Path) -> bytes:
    torch.save({"state_dict": {"w": torch.zeros(100)}}, path)
    return path.read_bytes()[: path.stat().st_size // 2]


BROKEN = {
    "empty": (lambda path: b"", " as a Lightning checkpoint: damaged (EOFError)"),
    "truncated": (_truncated, " as a Lightning checkpoint: damaged (PytorchStreamReader failed"),
    "garbage": (lambda path: b"not a checkpoint", ": not a checkpoint (its pickle is damaged or foreign)"),
}


@pytest.mark.parametrize("case", list(BROKEN))
@pytest.mark.parametrize("mmap", [False, True])
def test_a_broken_file_is_one_line(tmp_path, case, mmap):
    content, expected = BROKEN[case]
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(content(broken))
    with pytest.raises(MLMAdaptError) as error:
        load_weights_only(broken, key="--model", mmap=mmap)
    message = str(error.value)
    assert message.startswith(f"--model: cannot read {broken}{expected}"), message
    assert "\n" not in message and "weights_only" not in message


def sharded_checkpoint(directory: Path) -> Path:
    """An FSDP sharded checkpoint as FSDPStrategy lays it out: DCP shards + .metadata, the rest in meta.pt."""
    _distributed_checkpoint_save({"model": {"model.w": torch.arange(6.0).reshape(2, 3)}}, directory)
    torch.save({"global_step": 3, "hyper_parameters": {"max_seq_length": 64}}, directory / _METADATA_FILENAME)
    return directory


def test_sharded_checkpoint_loads(tmp_path):
    checkpoint = load_sharded(sharded_checkpoint(tmp_path / "step3.ckpt"))
    assert torch.equal(checkpoint["model"]["model.w"], torch.arange(6.0).reshape(2, 3))
    assert checkpoint["global_step"] == 3


def test_crafted_sharded_metadata_is_refused_without_running_its_code(tmp_path):
    directory = sharded_checkpoint(tmp_path / "step3.ckpt")
    marker = tmp_path / "pwned"
    # torch.distributed.checkpoint reads .metadata with a plain pickle.load.
    (directory / ".metadata").write_bytes(pickle.dumps(CreatesMarker(marker)))
    with pytest.raises(MLMAdaptError, match=r"refusing to load .*\.metadata: it needs (builtins\.)?exec"):
        load_sharded(directory)
    assert not marker.exists()


def test_crafted_sharded_meta_pt_is_refused(tmp_path):
    directory = sharded_checkpoint(tmp_path / "step3.ckpt")
    marker = tmp_path / "pwned"
    crafted_checkpoint(directory / _METADATA_FILENAME, marker)
    with pytest.raises(MLMAdaptError, match=r"refusing to load .*meta\.pt"):
        load_sharded(directory)
    assert not marker.exists()


def test_numpy_values_load_weights_only_and_code_is_still_refused(tmp_path):
    values = {
        "scalar": numpy.float64(1.5),
        "integer": numpy.int64(3),
        "array": numpy.arange(6, dtype=numpy.float32).reshape(2, 3),
        "text": numpy.str_("x"),
        "record": numpy.zeros(2, dtype=[("a", "f4"), ("b", "i8")]),
    }
    torch.save({"state_dict": {}, "callbacks": {"C": values}}, tmp_path / "numpy.ckpt")
    loaded = load_weights_only(tmp_path / "numpy.ckpt")["callbacks"]["C"]
    for key, value in values.items():
        assert type(loaded[key]) is type(value) and numpy.array_equal(loaded[key], value), key
    marker = tmp_path / "pwned"
    torch.save(
        {"callbacks": {"C": numpy.array([CreatesMarker(marker)], dtype=object)}}, tmp_path / "evil.ckpt"
    )
    with pytest.raises(MLMAdaptError, match=r"it needs (builtins\.)?exec"):
        load_weights_only(tmp_path / "evil.ckpt")
    assert not marker.exists()


@pytest.mark.slow
def test_a_checkpoint_with_numpy_callback_state_resumes_and_exports(tiny_model_dir, corpus_file, tmp_path):
    """A class-path callback keeping np.float64 and arrays: fit's checkpoint is read by its own resume and
    export (both refused it: "it needs numpy._core.multiarray...")."""
    state = (
        "--trainer.callbacks+=tests.recorder.NumpyState",
        f"--trainer.callbacks.out_file={tmp_path / 'state.json'}",
    )
    checkpoints = (
        "--trainer.callbacks+=ModelCheckpoint",
        f"--trainer.callbacks.dirpath={tmp_path / 'ckpt'}",
        "--trainer.callbacks.save_last=true",
    )
    first = run_cli(
        "fit",
        *tiny_fit_args(tiny_model_dir, corpus_file, tmp_path, "--trainer.max_steps=2", *checkpoints, *state),
    )
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_cli(
        "fit",
        *tiny_fit_args(
            tiny_model_dir,
            corpus_file,
            tmp_path,
            "--trainer.max_steps=3",
            *checkpoints,
            *state,
            "--export.overwrite=true",
            "--ckpt_path=last",
        ),
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((tmp_path / "state.json").read_text(encoding="utf-8")) == {
        "best": ["float64", 2.0],
        "history": ["ndarray", [1.0, 2.0]],
        "steps": ["int64", 2],
    }
    exported = run_cli(
        "export", f"--ckpt_path={tmp_path / 'ckpt' / 'last.ckpt'}", f"--output_dir={tmp_path / 'x'}"
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
