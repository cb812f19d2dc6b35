"""Data under distribution: a real 2-process DDP fit on CPU (gloo) through the CLI, and the sampler."""

from __future__ import annotations

import re

import pytest
from conftest import run_cli, tiny_fit_args
from recorder import read_records

from mlm_adapt.data.samplers import EpochSampler


@pytest.mark.slow
def test_ddp_fit_two_ranks_see_disjoint_examples_and_checkpoint_once(tiny_model_dir, corpus_file, tmp_path):
    rec = tmp_path / "rec"
    steps, batch_size = 4, 8
    result = run_cli(
        "fit",
        *tiny_fit_args(
            tiny_model_dir,
            corpus_file,
            tmp_path,
            "--trainer.devices=2",
            "--trainer.strategy=ddp",
            f"--trainer.max_steps={steps}",
            "--trainer.callbacks+=tests.recorder.BatchRecorder",
            f"--trainer.callbacks.out_dir={rec}",
        ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [read_records(rec, r) for r in (0, 1)]
    assert [len(r) for r in ranks] == [steps, steps]
    assert {rec["world_size"] for r in ranks for rec in r} == {2}
    ids = [[i for rec in r for i in rec["ids"]] for r in ranks]
    assert [len(i) for i in ids] == [steps * batch_size] * 2
    assert len(set(ids[0])) == len(ids[0]) and len(set(ids[1])) == len(ids[1])  # no repeats within a rank
    assert not set(ids[0]) & set(ids[1]), "the two ranks trained on the same examples"
    # Same step on both ranks: different examples, hence different masked batches.
    assert all(a["digest"] != b["digest"] for a, b in zip(*ranks, strict=True))
    # Checkpoint, config and logs are written once (by rank 0), not once per process.
    assert len(list(tmp_path.glob("lightning_logs/*"))) == 1
    ckpts = list(tmp_path.glob("lightning_logs/version_0/checkpoints/*.ckpt"))
    assert [c.name for c in ckpts] == [f"epoch=0-step={steps}.ckpt"]
    assert len(list(tmp_path.rglob("config.yaml"))) == 1
    exports = list(tmp_path.rglob("hf_model"))
    assert len(exports) == 1 and (exports[0] / "model.safetensors").is_file()
    # The effective global batch is reported once, for the whole world.
    out = result.stdout + result.stderr
    summaries = re.findall(r"global batch (\d+) = (\d+) per device x (\d+) accumulation x (\d+)", out)
    assert summaries == [("16", "8", "1", "2")]
    assert "tokens per step 1,024" in out


def test_epoch_sampler_shards_are_disjoint_cover_the_data_and_reshuffle_per_epoch():
    n, world = 103, 2
    samplers = [EpochSampler(range(n), num_replicas=world, rank=r, seed=7) for r in range(world)]
    orders = {}
    for epoch in (0, 1):
        shards = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            items = list(sampler)
            assert {e for e, _ in items} == {epoch}
            shards.append([i for _, i in items])
        assert len(shards[0]) == len(shards[1])  # same number of batches on both ranks
        # DistributedSampler pads an odd total with one repeated index; everything else is disjoint.
        assert len(set(shards[0]) & set(shards[1])) <= 1
        assert set(shards[0]) | set(shards[1]) == set(range(n))
        orders[epoch] = shards[0]
    assert orders[0] != orders[1]


def test_global_batch_info_counts_accumulation_devices_and_nodes():
    from types import SimpleNamespace

    from mlm_adapt.training.scale import GlobalBatchInfo

    logged = []
    logger = SimpleNamespace(log_metrics=lambda metrics, step: logged.append((metrics, step)))
    trainer = SimpleNamespace(
        datamodule=SimpleNamespace(hparams={"batch_size": 32, "max_seq_length": 512}),
        accumulate_grad_batches=4,
        world_size=16,
        num_nodes=2,
        strategy=object(),
        loggers=[logger],
        global_step=0,
    )
    callback = GlobalBatchInfo()
    callback.on_train_start(trainer, None)
    assert callback.info["global_batch_size"] == 32 * 4 * 16
    assert callback.info["tokens_per_step"] == 32 * 4 * 16 * 512
    assert logged == [({f"scale/{k}": float(v) for k, v in callback.info.items()}, 0)]
