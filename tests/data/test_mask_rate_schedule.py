"""Masking-rate schedules through the DataModule: per-step rates, ranks, workers, resume, validation, fit."""

from __future__ import annotations

import math
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from conftest import make_datamodule, quiet_trainer

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.export.card import ExportInfo, render_model_card
from mlm_adapt.masking.schedule import Stepping, parse_schedule, trainer_stepping
from mlm_adapt.model import MaskedLMModule

DECAY = [[0.0, 0.30], [1.0, 0.15]]
ACCUMULATE = 2


def _datamodule(model_dir, corpus, tmp_path, **overrides):
    dm = make_datamodule(model_dir, corpus, tmp_path, max_seq_length=32, **overrides)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _attach_trainer(dm, world_size=1, rank=0, accumulate=ACCUMULATE):
    """What the sampler reads from a Lightning trainer, for a one-epoch run with ``accumulate``."""
    batches = math.ceil(len(dm.train_dataset) // world_size / dm.hparams.batch_size)
    dm.trainer = SimpleNamespace(
        world_size=world_size,
        global_rank=rank,
        limit_train_batches=1.0,
        max_epochs=1,
        max_steps=-1,
        num_training_batches=batches,
        accumulate_grad_batches=accumulate,
        estimated_stepping_batches=math.ceil(batches / accumulate),
    )
    return dm.trainer


def _rate(batch) -> float:
    return float((batch["labels"] != -100).sum()) / float(batch["maskable_tokens"].sum())


def test_batches_map_to_the_optimizer_step_they_feed():
    stepping = Stepping(batches_per_epoch=10, accumulate=3, total_steps=8)
    assert [stepping.step(0, b) for b in range(10)] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert stepping.step(1, 0) == 4  # Lightning steps on the last, incomplete window of an epoch


def test_realized_rate_follows_the_schedule_over_the_run(tiny_model_dir, corpus_file, tmp_path):
    dm = _datamodule(tiny_model_dir, corpus_file, tmp_path, masking={"mlm_probability": DECAY})
    trainer = _attach_trainer(dm)
    schedule = parse_schedule(DECAY)
    realized, scheduled = [], []
    for index, batch in enumerate(dm.train_dataloader()):
        realized.append(_rate(batch))
        scheduled.append(schedule.rate_at_step(index // ACCUMULATE, trainer.estimated_stepping_batches))
    assert len(realized) == trainer.num_training_batches >= 40
    quarter = len(realized) // 4
    for start in range(0, 4 * quarter, quarter):  # averaged over many batches, at several points of the run
        got = sum(realized[start : start + quarter]) / quarter
        want = sum(scheduled[start : start + quarter]) / quarter
        assert abs(got - want) <= 0.01, (start, got, want)
    assert scheduled[0] == 0.30 and scheduled[-1] < 0.16


def test_every_rank_sees_the_same_rate_at_the_same_step(tiny_model_dir, corpus_file, tmp_path):
    dm = _datamodule(tiny_model_dir, corpus_file, tmp_path, masking={"mlm_probability": DECAY})
    rates, examples = [], []
    for rank in (0, 1):
        _attach_trainer(dm, world_size=2, rank=rank)
        keys = list(dm.train_dataloader().sampler)
        rates.append([rate for _, _, rate in keys])
        examples.append({index for _, index, _ in keys})
    assert rates[0] == rates[1]
    assert not examples[0] & examples[1]  # different examples, same rate per position
    per_batch = rates[0][:: dm.hparams.batch_size]
    assert per_batch[0] == per_batch[1] and per_batch[1] > per_batch[2]  # changes at optimizer steps only


def test_workers_and_mid_epoch_resume_give_bit_identical_masks(tiny_model_dir, corpus_file, tmp_path):
    def loader(workers):
        dm = _datamodule(
            tiny_model_dir, corpus_file, tmp_path, masking={"mlm_probability": DECAY}, num_workers=workers
        )
        _attach_trainer(dm)
        train = dm.train_dataloader()
        train.sampler.set_epoch(1)
        return train

    reference = [(b["input_ids"], b["labels"]) for b in loader(0)]
    first = loader(2)
    it = iter(first)
    seen = [next(it) for _ in range(7)]
    state = first.state_dict()
    del it
    second = loader(2)
    second.load_state_dict(state)
    resumed = seen + list(second)
    assert len(resumed) == len(reference)
    for (ids, labels), batch in zip(reference, resumed, strict=True):
        assert torch.equal(ids, batch["input_ids"]) and torch.equal(labels, batch["labels"])


def test_validation_masks_do_not_depend_on_the_training_rate(tiny_model_dir, corpus_file, tmp_path):
    def val_batches(**overrides):
        dm = _datamodule(tiny_model_dir, corpus_file, tmp_path, **overrides)
        return [(b["input_ids"], b["labels"]) for b in dm.val_dataloader()]

    default = val_batches()
    for rate in (DECAY, 0.4):
        assert all(
            torch.equal(a, c) and torch.equal(b, d)
            for (a, b), (c, d) in zip(default, val_batches(masking={"mlm_probability": rate}), strict=True)
        )
    other = val_batches(masking={"eval_mlm_probability": 0.3})
    assert sum(int((b != -100).sum()) for _, b in other) > sum(int((b != -100).sum()) for _, b in default)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"masking": {"mlm_probability": [[0.0, 0.3], [1.0, 1.0]]}}, "rate 1.0 must be in (0, 1)"),
        ({"masking": {"mlm_probability": [[0.2, 0.3], [0.1, 0.15]]}}, "strictly increasing"),
        ({"masking": {"eval_mlm_probability": 0.0}}, "data.masking.eval_mlm_probability=0.0"),
        ({"masking": {"mlm_probability": DECAY}, "streaming": {"enabled": True}}, "needs a map-style corpus"),
    ],
    ids=["rate_one", "fractions_decrease", "eval_rate_zero", "streaming"],
)
def test_bad_masking_settings_fail_at_construction(
    tiny_model_dir, corpus_file, tmp_path, overrides, fragment
):
    with pytest.raises(MLMAdaptError) as error:
        make_datamodule(tiny_model_dir, corpus_file, tmp_path, **overrides)
    assert fragment in str(error.value) and "\n" not in str(error.value)


class _RateLog(L.Callback):
    def __init__(self):
        self.rates: list[float] = []
        self.stepping: tuple[Stepping, Stepping] | None = None

    def on_train_start(self, trainer, pl_module):
        ours = trainer_stepping(trainer, len(trainer.train_dataloader))
        lightning = Stepping(
            trainer.num_training_batches, trainer.accumulate_grad_batches, trainer.estimated_stepping_batches
        )
        self.stepping = (ours, lightning)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rates.append(float(trainer.callback_metrics["train/mlm_probability"]))


@pytest.mark.parametrize(
    "run",
    [dict(max_steps=12), dict(max_epochs=2, limit_train_batches=0.1, accumulate_grad_batches=2)],
    ids=["max_steps", "epochs_limit_accumulate"],
)
def test_fit_logs_the_scheduled_rate(tiny_model_dir, corpus_file, tmp_path, run):
    workers = 2 if "max_epochs" in run else 0  # workers prefetch before Lightning counts the batches
    dm = make_datamodule(
        tiny_model_dir,
        corpus_file,
        tmp_path,
        masking={"mlm_probability": [[0.0, 0.4], [1.0, 0.1]]},
        num_workers=workers,
    )
    module = MaskedLMModule(str(tiny_model_dir), max_seq_length=64)
    log = _RateLog()
    trainer = quiet_trainer(**run, limit_val_batches=0, callbacks=[log], log_every_n_steps=1)
    trainer.fit(module, datamodule=dm)
    ours, lightning = log.stepping
    assert ours == lightning  # the sampler's steps are Lightning's
    assert len(log.rates) >= 12
    assert sum(log.rates[:4]) / 4 > 0.32 and sum(log.rates[-4:]) / 4 < 0.2


def test_model_card_records_the_schedule():
    info = ExportInfo(data_hparams={"masking": {"mlm_probability": DECAY, "eval_mlm_probability": 0.15}})
    text = str(render_model_card(info, title="demo"))
    assert "- mlm_probability: 0.3 at 0% -> 0.15 at 100% of the optimizer steps" in text
    assert "- eval_mlm_probability (validation masks): 0.15" in text
