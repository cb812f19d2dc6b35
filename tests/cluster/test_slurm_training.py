"""``scripts/slurm/train.sbatch`` on a real two-node Slurm cluster: DDP, preemption, scancel, a dead rank.

Every job is the shipped sbatch file with configs/domain.yaml and the CPU overrides its header documents;
each test's job writes only under its own directory. ``tests.recorder.BatchRecorder`` records every rank's
batches and losses (and slows the job to 0.1 s a step, so that it can be signalled mid-run).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from recorder import read_records
from slurm_jobs import (
    CPU_JOB,
    DOMAIN_CONFIG,
    REPO,
    TRAIN_SBATCH,
    job_log,
    local_cluster,
    recorded_steps,
    wait_for,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")  # stopped at the module's end: the next module starts its own
def slurm_cluster(tmp_path_factory):
    yield from local_cluster(tmp_path_factory)


STEPS = 60
SIGNAL_AFTER = 20  # recorded batches before the test signals the job


def training_args(model: Path, corpus: Path, rec: Path, *extra: str) -> list[str]:
    """configs/domain.yaml on the tiny model, CPU, a 60-step run crossing an epoch and three validations."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.precision=32-true",
        f"--model.model_name_or_path={model}",
        "--model.max_seq_length=64",
        f"--data.train_files=[{corpus}]",
        "--data.validation_split=0.1",
        "--data.batch_size=8",
        "--data.num_workers=0",
        "--data.preprocessing_num_workers=1",
        f"--trainer.max_steps={STEPS}",
        "--trainer.max_epochs=-1",
        "--trainer.limit_train_batches=25",
        "--trainer.val_check_interval=20",
        "--trainer.limit_val_batches=2",
        "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.callbacks+=tests.recorder.BatchRecorder",
        f"--trainer.callbacks.out_dir={rec}",
        "--trainer.callbacks.pause_s=0.1",
        *extra,
    ]


def submit_training(
    cluster, directory: Path, model: Path, corpus: Path, *extra: str, root: str | None = None
):
    directory.mkdir(parents=True, exist_ok=True)
    env = {"CONFIG": str(DOMAIN_CONFIG), **({"ROOT": root} if root else {})}
    args = training_args(model, corpus, directory / "rec", *extra)
    return cluster.sbatch(*CPU_JOB, str(TRAIN_SBATCH), *args, cwd=directory, env=env)


def losses(rec: Path) -> dict[int, list[tuple[int, float]]]:
    """Every rank's (step, loss) pairs in the order they were trained."""
    return {rank: [(r["step"], r["loss"]) for r in read_records(rec, rank, "loss")] for rank in (0, 1)}


def assert_same_losses(got: dict, expected: dict) -> None:
    for rank in expected:
        assert [s for s, _ in got[rank]] == [s for s, _ in expected[rank]] == list(range(STEPS))
        worst = max(abs(a - b) for (_, a), (_, b) in zip(got[rank], expected[rank], strict=True))
        assert worst <= 1e-6, f"rank {rank}: max |loss difference| {worst:.3g}"


def files_outside(directory: Path, root: Path) -> list[str]:
    """Files the job wrote in its directory outside its run root, its datasets cache and its Slurm log."""
    allowed = (root, directory / "rec", directory / ".cache")

    def expected(path: Path) -> bool:
        return any(path.is_relative_to(a) for a in allowed) or (
            path.parent == directory and path.suffix == ".out"  # the Slurm log, where sbatch ran
        )

    return [str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and not expected(p)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, review_texts) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "reviews.txt"
    path.write_text("\n".join(review_texts) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def straight_job(slurm_cluster, tmp_path_factory, tiny_model_dir, corpus):
    """One uninterrupted two-node job: the reference for the interrupted ones."""
    directory = tmp_path_factory.mktemp("straight")
    job_id = submit_training(slurm_cluster, directory, tiny_model_dir, corpus)
    record = slurm_cluster.wait(job_id, timeout=300)
    return directory, job_id, record


def test_two_node_fit_trains_ddp_across_nodes_and_keeps_every_file_under_its_root(
    straight_job,
    slurm_cluster,
):
    directory, job_id, record = straight_job
    log = job_log(directory, job_id)
    assert record["JobState"] == "COMPLETED", log[-4000:]
    assert record["NodeList"] == "n[1-2]"
    recorded = [read_records(directory / "rec", rank) for rank in (0, 1)]
    assert [{r["world_size"] for r in recs} for recs in recorded] == [{2}, {2}]
    assert [len(recs) for recs in recorded] == [STEPS, STEPS]
    # In every epoch the ranks trained on disjoint examples.
    for epoch in {r["epoch"] for r in recorded[0]}:
        seen = [{i for r in recs if r["epoch"] == epoch for i in r["ids"]} for recs in recorded]
        assert seen[0] and seen[1] and not seen[0] & seen[1]
    root = directory / "runs" / f"mlm_adapt-{job_id}"
    exports = [p.parent for p in directory.rglob("model.safetensors")]
    assert exports == [root / "export"], exports
    assert (root / "csv" / "version_0" / "metrics.csv").is_file()
    assert list((root / "tensorboard" / "version_0").glob("events.out.tfevents.*"))
    assert (root / "tensorboard" / "version_0" / "checkpoints" / "last.ckpt").is_file()  # the first logger's
    assert files_outside(directory, root) == []
    # One process of the job segmented and tokenized the corpus into the shared cache (one line for the
    # training and one for the validation documents); the other node waited for it and loaded the cache.
    started = re.findall(r"Segmenting, tokenizing and packing[^\r\n]*?\s0%\|", log)
    assert len(started) == 2, log[-4000:]
    assert "waiting for the preprocessing" in log
    # The best checkpoint by val/loss was never saved (every_n_train_steps 2000): the message says so.
    assert "no ModelCheckpoint monitoring 'val/loss' saved a checkpoint" in log
    assert "was never logged" not in log


def test_preempted_job_requeues_and_trains_exactly_as_the_uninterrupted_one(
    straight_job,
    slurm_cluster,
    tmp_path,
    tiny_model_dir,
    corpus,
):
    job_id = submit_training(slurm_cluster, tmp_path, tiny_model_dir, corpus)
    wait_for(lambda: recorded_steps(tmp_path / "rec" / "rank0.jsonl") >= SIGNAL_AFTER, 240, "training steps")
    slurm_cluster.run("scancel", "--signal=USR1", job_id)  # what --signal=SIGUSR1@90 sends before the limit
    record = slurm_cluster.wait(job_id, timeout=300)
    log = job_log(tmp_path, job_id)
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1", log[-4000:]
    assert "requeued Slurm job" in log and "resuming" in log
    assert_same_losses(losses(tmp_path / "rec"), losses(straight_job[0] / "rec"))
    # Same examples and the same masks at every step, on both ranks.
    key = ("step", "ids", "digest")
    for rank in (0, 1):
        got = [{k: r[k] for k in key} for r in read_records(tmp_path / "rec", rank)]
        assert got == [{k: r[k] for k in key} for r in read_records(straight_job[0] / "rec", rank)]
    root = tmp_path / "runs" / f"mlm_adapt-{job_id}"
    assert [p.parent for p in tmp_path.rglob("model.safetensors")] == [root / "export"]
    assert not list(root.rglob("hpc_ckpt*")) and files_outside(tmp_path, root) == []


def test_scancel_saves_last_checkpoint_ends_nonzero_and_a_resubmission_continues(
    straight_job,
    slurm_cluster,
    tmp_path,
    tiny_model_dir,
    corpus,
):
    root = "runs/cancelled"  # a fixed root: the resubmitted job continues the cancelled one's run
    job_id = submit_training(slurm_cluster, tmp_path, tiny_model_dir, corpus, root=root)
    wait_for(lambda: recorded_steps(tmp_path / "rec" / "rank0.jsonl") >= SIGNAL_AFTER, 240, "training steps")
    slurm_cluster.run("scancel", job_id)  # SIGTERM to every task, SIGKILL after KillWait
    record = slurm_cluster.wait(job_id, timeout=120)
    log = job_log(tmp_path, job_id)
    assert record["JobState"] == "CANCELLED", log[-4000:]
    last = tmp_path / root / "tensorboard" / "version_0" / "checkpoints" / "last.ckpt"
    assert last.is_file(), log[-4000:]
    assert "stopped by SIGTERM: saved" in log
    assert not list(tmp_path.rglob("model.safetensors"))  # no export of an unfinished run
    steps_before = recorded_steps(tmp_path / "rec" / "rank0.jsonl")
    assert 0 < steps_before < STEPS

    job_id = submit_training(slurm_cluster, tmp_path, tiny_model_dir, corpus, root=root)
    record = slurm_cluster.wait(job_id, timeout=300)
    log = job_log(tmp_path, job_id)
    assert record["JobState"] == "COMPLETED", log[-4000:]
    assert "ckpt_path last: resuming" in log
    assert_same_losses(losses(tmp_path / "rec"), losses(straight_job[0] / "rec"))
    assert [p.parent for p in tmp_path.rglob("model.safetensors")] == [tmp_path / root / "export"]


def test_a_dead_rank_ends_the_whole_job_without_an_export(
    slurm_cluster,
    tmp_path,
    tiny_model_dir,
    corpus,
):
    # Rank 1 (node n2) is SIGKILLed at step 15, as the OOM killer would.
    extra = ["--trainer.callbacks.kill_at_step=15", "--trainer.callbacks.kill_rank=1"]
    job_id = submit_training(slurm_cluster, tmp_path, tiny_model_dir, corpus, *extra)
    wait_for(lambda: recorded_steps(tmp_path / "rec" / "rank1.jsonl") >= 15, 240, "rank 1 to reach step 15")
    died = time.monotonic()
    record = slurm_cluster.wait(job_id, timeout=120)
    ended_after = time.monotonic() - died
    log = job_log(tmp_path, job_id)
    assert record["JobState"] in {"FAILED", "CANCELLED"} and record["ExitCode"] != "0:0", log[-4000:]
    assert ended_after < 90, f"the job took {ended_after:.0f} s to end after its rank died"
    assert not list(tmp_path.rglob("model.safetensors")) and not list(tmp_path.rglob("*.staging*"))
    assert recorded_steps(tmp_path / "rec" / "rank0.jsonl") < STEPS
    # No rank of the job is left running on either node.
    leftover = subprocess.run(["pgrep", "-f", f"callbacks.out_dir={tmp_path}/rec"], capture_output=True)
    assert leftover.returncode == 1, leftover.stdout


def test_torchrun_on_two_launchers_trains_as_the_slurm_job(straight_job, tmp_path, tiny_model_dir, corpus):
    """Without Slurm: two torchrun launchers (one per "node") meet by c10d rendezvous on 127.0.0.1."""
    port = 29400 + os.getpid() % 500
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        PYTHONPATH=f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"
    )
    rec = tmp_path / "rec"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=mlm-adapt-test",
        "-m", "mlm_adapt", "fit", "--config", str(DOMAIN_CONFIG),
        "--trainer.devices=1", "--trainer.num_nodes=2", f"--trainer.default_root_dir={tmp_path / 'run'}",
        f"--data.cache_dir={tmp_path / 'cache'}",
        *training_args(tiny_model_dir, corpus, rec),
    ]  # fmt: skip
    launchers = [
        subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    outputs = []
    for launcher in launchers:
        try:
            out, _ = launcher.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for other in launchers:
                other.send_signal(signal.SIGKILL)
            raise
        outputs.append(out.decode(errors="replace"))
    assert [p.returncode for p in launchers] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    # c10d may give either launcher rank 0: the two ranks' losses, as a set, equal the Slurm job's.
    got, expected = losses(rec), losses(straight_job[0] / "rec")
    if not math.isclose(got[0][0][1], expected[0][0][1], abs_tol=1e-6):
        got = {0: got[1], 1: got[0]}
    assert_same_losses(got, expected)
    exports = [p.parent for p in tmp_path.rglob("model.safetensors")]
    assert exports == [tmp_path / "run" / "export"]
    assert json.loads((tmp_path / "run" / "export" / "config.json").read_text())["model_type"] == "bert"
