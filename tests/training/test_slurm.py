"""SLURM: the pre-timeout SIGUSR1 in a simulated SLURM job writes a resumable checkpoint; the sbatch file."""

from __future__ import annotations

import re
import subprocess

import pytest
import torch
from conftest import REPO, run_cli, tiny_fit_args
from recorder import read_records

SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"


@pytest.mark.slow
def test_sigusr1_in_a_slurm_job_saves_a_checkpoint(tiny_model_dir, corpus_file, tmp_path, monkeypatch):
    # What srun exports to each task; Lightning's SLURMEnvironment is detected from these.
    slurm = {
        "SLURM_NTASKS": "1",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_JOB_NAME": "mlm_adapt",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODELIST": "localhost",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
    }
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    rec, signal_at = tmp_path / "rec", 3
    result = run_cli(
        "fit",
        *tiny_fit_args(
            tiny_model_dir,
            corpus_file,
            tmp_path,
            "--trainer.max_steps=5",
            # The same plugin flags as scripts/slurm/train.sbatch.
            "--trainer.plugins+=lightning.pytorch.plugins.environments.SLURMEnvironment",
            "--trainer.plugins.auto_requeue=true",
            "--trainer.plugins.requeue_signal=SIGUSR1",
            # Stands in for `#SBATCH --signal=SIGUSR1@90`: the job receives SIGUSR1 at step 3.
            "--trainer.callbacks+=tests.recorder.BatchRecorder",
            f"--trainer.callbacks.out_dir={rec}",
            f"--trainer.callbacks.kill_at_step={signal_at}",
            "--trainer.callbacks.kill_signal=SIGUSR1",
        ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Handling auto-requeue signal" in result.stdout + result.stderr
    hpc = list(tmp_path.glob("hpc_ckpt_*.ckpt"))
    assert [p.name for p in hpc] == ["hpc_ckpt_1.ckpt"]
    checkpoint = torch.load(hpc[0], map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == signal_at
    # The data position travels with it, so the requeued job continues with the next batch.
    assert checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert [r["step"] for r in read_records(rec)] == [0, 1, 2, 3, 4]  # training went on after the save


def test_sbatch_template_is_valid_bash_and_requests_the_pre_timeout_signal():
    text = SBATCH.read_text(encoding="utf-8")
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    assert re.search(r"^#SBATCH --signal=SIGUSR1@\d+$", text, re.M)
    assert re.search(r"^#SBATCH --requeue$", text, re.M)
    assert "srun" in text and "python -m mlm_adapt fit" in text
    ntasks = re.search(r"^#SBATCH --ntasks-per-node=(\d+)$", text, re.M).group(1)
    gpus = re.search(r"^#SBATCH --gres=gpu:(\d+)$", text, re.M).group(1)
    assert ntasks == gpus  # one task per GPU, as Lightning's SLURMEnvironment expects
