"""The sbatch files as files (valid bash, the signals they request); jobs on a real cluster: tests/cluster."""

from __future__ import annotations

import re
import subprocess

from conftest import REPO

SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"


def test_sbatch_template_is_valid_bash_and_requests_the_pre_timeout_signal():
    text = SBATCH.read_text(encoding="utf-8")
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    assert re.search(r"^#SBATCH --signal=SIGUSR1@\d+$", text, re.M)
    assert re.search(r"^#SBATCH --requeue$", text, re.M)
    assert "srun" in text and '"$PYTHON" -m mlm_adapt fit' in text
    ntasks = re.search(r"^#SBATCH --ntasks-per-node=(\d+)$", text, re.M).group(1)
    gpus = re.search(r"^#SBATCH --gres=gpu:(\d+)$", text, re.M).group(1)
    assert ntasks == gpus  # one task per GPU, as Lightning's SLURMEnvironment expects
