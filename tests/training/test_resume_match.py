"""``ResumeMatch``: the one check of what a checkpoint must match, on the record it saved."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.training.exact_resume import ExactResume
from mlm_adapt.training.resume import (
    CORPUS_KEY,
    SETTINGS_KEY,
    WORLD_KEY,
    ResumeMatch,
    run_settings,
)

ADAMW = {"class_path": "torch.optim.AdamW", "init_args": {"lr": 5e-5, "weight_decay": 0.01}}
MODEL = {"model_name_or_path": "tiny-bert", "max_seq_length": 64, "learning_rate": 1.0}
DATA = {
    "tokenizer_name_or_path": "tiny-bert",
    "batch_size": 8,
    "segmentation": {"segmenter": "rjieba", "user_dict": None},
    "num_workers": 2,
}


def match_for(
    optimizer=ADAMW, fingerprint="f" * 32, world_size=1, streaming=False, data=None, seed_everything=None
) -> ResumeMatch:
    match = ResumeMatch(optimizer=optimizer, seed_everything=seed_everything)
    match.settings = run_settings(MODEL, {**DATA, **(data or {})}, optimizer, seed_everything)
    match.corpus_fingerprint, match.world_size, match.streaming = fingerprint, world_size, streaming
    return match


def checkpoint_of(match: ResumeMatch, **entries) -> dict:
    """What a fit with ``match`` writes: its record among the callbacks' states."""
    return {"callbacks": {"ResumeMatch": match.state_dict()}, **entries}


def test_the_record_holds_only_the_fixed_settings_with_the_optimizer():
    record = match_for().state_dict()
    assert record[SETTINGS_KEY] == {
        "model": {"model_name_or_path": "tiny-bert", "max_seq_length": 64, "optimizer": ADAMW},
        "data": {
            "tokenizer_name_or_path": "tiny-bert",
            "batch_size": 8,
            "segmentation.segmenter": "rjieba",
            "segmentation.user_dict": None,
        },
        "run": {},
    }
    assert record[CORPUS_KEY] == "f" * 32 and record[WORLD_KEY] == 1


def test_the_same_run_resumes_and_every_changed_fixed_setting_is_one_line():
    saved = checkpoint_of(match_for())
    match_for().check(saved)
    changed = match_for(optimizer={**ADAMW, "init_args": {"lr": 1e-4, "weight_decay": 0.01}})
    with pytest.raises(MLMAdaptError, match=r"model\.optimizer\.init_args\.lr: 5e-05 -> 0\.0001") as error:
        changed.check(saved, "last.ckpt")
    assert "\n" not in str(error.value) and "cannot resume last.ckpt" in str(error.value)
    with pytest.raises(MLMAdaptError, match=r"training corpus: fingerprint ffffffffffff -> aaaaaaaaaaaa"):
        match_for(fingerprint="a" * 32).check(saved)


def test_the_optimizer_is_read_from_the_record_not_from_the_export_callbacks_config():
    # The export callback's saved config says another learning rate: the resume record is what counts.
    exported = "model:\n  optimizer:\n    class_path: torch.optim.AdamW\n    init_args: {lr: 1.0}\n"
    saved = checkpoint_of(match_for())
    saved["callbacks"]["HFExport"] = {"config_yaml": exported}
    match_for().check(saved)


def test_a_checkpoint_the_cli_did_not_name_is_checked_when_it_is_restored():
    # Trainer.fit(ckpt_path=...) from Python, or Lightning's hpc checkpoint: no expect() before setup.
    saved = checkpoint_of(match_for())
    trainer = SimpleNamespace(state=SimpleNamespace(fn="fit"), ckpt_path="hpc_ckpt_1.ckpt", loggers=[])
    with pytest.raises(MLMAdaptError, match=r"cannot resume hpc_ckpt_1\.ckpt .*training corpus"):
        match_for(fingerprint="a" * 32).on_load_checkpoint(trainer, None, saved)
    match_for().on_load_checkpoint(trainer, None, saved)
    validating = SimpleNamespace(state=SimpleNamespace(fn="validate"), ckpt_path="x.ckpt", loggers=[])
    match_for(fingerprint="a" * 32).on_load_checkpoint(validating, None, saved)  # weights only: not a resume


# Each setting that changes which examples are drawn, in which order, or how they are masked: (saved, new).
DRAW_AND_MASK = {
    "data.blocks.group_by_length": (True, False),
    "data.streaming.enabled": (False, True),
    "data.streaming.shuffle_buffer_size": (10_000, 500),
    "data.masking.scheme": ("whole_word", "token"),
    "data.masking.mlm_probability": ([[0.0, 0.3], [1.0, 0.15]], 0.15),
    "data.masking.mask_replace_prob": (0.8, 1.0),
    "data.masking.random_replace_prob": (0.1, 0.0),
    "data.masking.eval_mlm_probability": (0.15, 0.3),
}


@pytest.mark.parametrize("option", list(DRAW_AND_MASK))
def test_a_changed_draw_or_masking_setting_is_refused_naming_both_values(option):
    *group, name = option.removeprefix("data.").split(".")  # data.NAME, data.GROUP.NAME

    def data(value):
        return {group[0]: {name: value}} if group else {name: value}

    old, new = DRAW_AND_MASK[option]
    saved = checkpoint_of(match_for(data=data(old)))
    match_for(data=data(old)).check(saved)
    with pytest.raises(MLMAdaptError) as refused:
        match_for(data=data(new)).check(saved, "last.ckpt")
    assert f"{option}: {old!r} -> {new!r}" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("seed", [True, None, False])
def test_seed_everything_is_compared_when_it_is_a_number(seed):
    saved = checkpoint_of(match_for(seed_everything=42))
    with pytest.raises(MLMAdaptError, match=r"\(seed_everything: 42 -> 7\)"):
        match_for(seed_everything=7).check(saved)
    match_for(seed_everything=42).check(saved)
    match_for(seed_everything=seed).check(
        saved
    )  # `true` draws a seed each start: ExactResume keeps the run's


def test_exact_resume_keeps_the_checkpoints_seed():
    saved = ExactResume(seed=1234).state_dict()
    resumed = ExactResume(seed=99)  # seed_everything: true drew another at this start
    resumed.load_state_dict(saved)
    assert resumed.seed == 1234
