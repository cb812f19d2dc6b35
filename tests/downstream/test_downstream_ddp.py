"""Downstream evaluation under a real 2-process DDP fit on CPU: identical on both ranks, and equal to a
single-process evaluation of the same weights."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli, tiny_fit_args
from task_files import all_type_tasks
from transformers import AutoModelForMaskedLM, AutoTokenizer

from mlm_adapt.downstream import DownstreamEvaluation


def _read(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.slow
def test_ddp_ranks_log_the_single_device_scores(tiny_model_dir, corpus_file, tmp_path):
    tasks = all_type_tasks(tmp_path, n=60)  # sequence, pair, token and regression
    options = {"tasks": tasks, "bootstrap": 20}
    out = tmp_path / "ranks"
    result = run_cli(
        "fit",
        *tiny_fit_args(
            tiny_model_dir,
            corpus_file,
            tmp_path,
            "--trainer.devices=2",
            "--trainer.strategy=ddp",
            "--trainer.max_steps=4",
            "--trainer.val_check_interval=4",
            f"--downstream.tasks={json.dumps(tasks)}",
            "--downstream.bootstrap=20",
            "--trainer.callbacks+=tests.downstream.rank_metrics.RankMetrics",
            f"--trainer.callbacks.out_dir={out}",
            f"--export.output_dir={tmp_path / 'export'}",
        ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [_read(out / f"rank{r}.jsonl") for r in (0, 1)]
    assert ranks[0] == ranks[1]  # same steps, bit-identical values
    final = ranks[0][-1]
    assert final["step"] == 4 and "downstream/ner/f1" in final["metrics"]
    assert "downstream/pairs/accuracy" in final["metrics"] and "downstream/scores/pearson" in final["metrics"]
    # The exported final weights, scored in this process on one device, give the logged numbers.
    single = DownstreamEvaluation(**options)
    single.prepare(AutoTokenizer.from_pretrained(tmp_path / "export"), max_length=64)
    expected = single.evaluate(AutoModelForMaskedLM.from_pretrained(tmp_path / "export"))
    for name, value in expected.items():
        if name != "downstream/time_s":
            assert final["metrics"][name] == pytest.approx(value, abs=1e-6), name
