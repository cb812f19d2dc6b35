"""The loss of an optimizer step is the mean over the step's masked tokens, across micro-batches and ranks:
the same global batch gives the same loss and gradients however it is cut."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "step_gradients.py"


@pytest.fixture(scope="module")
def dropout_free_model(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny BERT without dropout: micro-batches would otherwise draw different dropout masks."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    out = tmp_path_factory.mktemp("no-dropout")
    model = AutoModelForMaskedLM.from_pretrained(
        tiny_model_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def step(model: Path, tmp_path: Path, batch_size: int, accumulation: int, devices: int = 1) -> dict:
    out = tmp_path / f"b{batch_size}-a{accumulation}-d{devices}.pt"
    if devices == 1:
        from step_gradients import one_step

        one_step(str(model), out, batch_size, accumulation, devices)
        return torch.load(out)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    args = [
        sys.executable,
        str(SCRIPT),
        str(model),
        str(out),
        str(batch_size),
        str(accumulation),
        str(devices),
    ]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out)


def max_difference(a: dict, b: dict) -> float:
    assert a["grads"].keys() == b["grads"].keys()
    return max(float((a["grads"][k] - b["grads"][k]).abs().max()) for k in a["grads"])


CUTS = {  # (batch size, accumulation, DDP ranks) of the same 4-row global batch
    "4 accumulated micro-batches": (1, 4, 1),
    "2 DDP ranks x 2 accumulated": (1, 2, 2),
    "2 DDP ranks, no accumulation": pytest.param((2, 1, 2), marks=pytest.mark.slow),
}


@pytest.mark.parametrize("cut", CUTS.values(), ids=CUTS.keys())
def test_the_same_global_batch_gives_the_same_loss_and_gradients_however_it_is_cut(
    dropout_free_model, tmp_path, cut
):
    from step_gradients import MASKED_COUNTS

    assert len(set(MASKED_COUNTS)) > 1  # the case a per-micro-batch mean gets wrong
    whole = step(dropout_free_model, tmp_path, batch_size=4, accumulation=1)
    batch_size, accumulation, devices = cut
    got = step(dropout_free_model, tmp_path, batch_size, accumulation, devices)
    scale = max(float(g.abs().max()) for g in whole["grads"].values())
    assert scale > 1e-4  # the gradients compared are not all ~0
    difference = max_difference(got, whole)
    print(
        f"batch {batch_size} x accumulation {accumulation} x {devices} rank(s): max |gradient difference| "
        f"{difference:.2e} (largest gradient {scale:.2e}); loss {got['loss']:.7f} vs {whole['loss']:.7f}"
    )
    assert difference <= 1e-6
    assert got["loss"] == pytest.approx(whole["loss"], abs=1e-6)
