"""A real two-node Slurm cluster for the ``cluster`` tests, and what they need to submit and watch jobs.

The cluster is ``scripts/slurm/local_cluster.sh`` (munge, ``slurmctld``, ``slurmd -N n1`` and ``-N n2`` on
127.0.0.1), started once per test module in a temporary directory and stopped by pid at its end (one cluster
at a time: they share the ports). Jobs run the
project's own ``scripts/slurm/*.sbatch`` with the CPU overrides their headers document.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCAL_CLUSTER = REPO / "scripts" / "slurm" / "local_cluster.sh"
TRAIN_SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"
PREPARE_SBATCH = REPO / "scripts" / "slurm" / "prepare.sbatch"
DOMAIN_CONFIG = REPO / "configs" / "domain.yaml"
FINISHED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
}
# What the sbatch files request for GPUs, turned into what the two CPU nodes have.
CPU_JOB = ["--nodes=2", "--ntasks-per-node=1", "--gres=none", "--cpus-per-task=1"]


def cluster_missing() -> str | None:
    """Why the cluster cannot start here (one line), or ``None``."""
    missing = [tool for tool in ("slurmctld", "slurmd", "munged", "sbatch") if shutil.which(tool) is None]
    if missing:
        return f"Slurm not installed ({', '.join(missing)} missing): apt-get install slurm-wlm"
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (slurmd runs job steps as their user)"
    return None


@dataclass
class Cluster:
    """The running cluster: its directory and the environment that jobs are submitted with."""

    directory: Path
    env: dict[str, str]

    def run(self, *command: str, check: bool = True, cwd: Path | None = None) -> str:
        result = subprocess.run(command, env=self.env, cwd=cwd, capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)}: {result.stderr.strip() or result.returncode}")
        return result.stdout

    def sbatch(self, *args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
        """Submits ``sbatch ARGS`` from ``cwd``; returns the job id."""
        # Nothing is made before submitting: a fresh clone's sbatch must find its log's directory itself.
        command = ["sbatch", "--parsable", *args]
        result = subprocess.run(
            command, env={**self.env, **(env or {})}, cwd=cwd, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a mapping (JobState, ExitCode, Restarts, NodeList, ...)."""
        line = self.run("scontrol", "-o", "show", "job", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", line))

    def wait(
        self, job_id: str, timeout: float, until: Callable[[dict], bool] | None = None
    ) -> dict[str, str]:
        """Waits until the job has finished (or ``until`` holds); returns its last record."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.job(job_id)
            if (
                until(record) if until else record.get("JobState") in FINISHED
            ) or time.monotonic() > deadline:
                return record
            time.sleep(0.5)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.2)


def recorded_steps(path: Path) -> int:
    """How many training batches a recorder file (``tests.recorder.BatchRecorder``) holds so far."""
    try:
        return len(path.read_text(encoding="utf-8").splitlines())
    except FileNotFoundError:
        return 0


def job_log(directory: Path, job_id: str) -> str:
    """The job's output file (``<name>-<id>.out`` where sbatch ran), every requeued run of it appended."""
    logs = list(directory.glob(f"*-{job_id}.out"))
    return logs[0].read_text(encoding="utf-8", errors="replace") if logs else ""


def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Starts the two-node cluster and stops exactly its daemons afterwards (the body of a fixture)."""
    reason = cluster_missing()
    if reason:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("slurm")
    started = subprocess.run(
        ["bash", str(LOCAL_CLUSTER), "start", str(directory)], capture_output=True, text=True, timeout=120
    )
    if started.returncode != 0:  # the script stops what it started; this catches what it could not
        subprocess.run(["bash", str(LOCAL_CLUSTER), "stop", str(directory)], timeout=120, check=False)
    assert started.returncode == 0, started.stdout + started.stderr
    env = {
        **os.environ,
        "SLURM_CONF": str(directory / "slurm.conf"),
        # Jobs run this interpreter's `python` and find the test callbacks (tests.recorder).
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    env.pop("OMP_NUM_THREADS", None)  # the sbatch file sets it from --cpus-per-task
    try:
        yield Cluster(directory, env)
    finally:
        subprocess.run(["bash", str(LOCAL_CLUSTER), "stop", str(directory)], timeout=120, check=False)
