"""``forgetting.warning``: one warning when a non-primary set's perplexity rises past the threshold."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from mlm_adapt.data.forgetting import ForgettingOptions
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.training import ForgettingWarning, forgotten_sets

BASELINE = {"val/perplexity": 100.0, "val_general/perplexity": 50.0, "val_news/perplexity": 40.0}


def test_only_non_primary_sets_above_the_threshold_are_reported():
    current = {"val/perplexity": 500.0, "val_general/perplexity": 61.0, "val_news/perplexity": 47.0}
    assert forgotten_sets(BASELINE, current, 0.2) == [("val_general", 50.0, 61.0)]
    assert forgotten_sets(BASELINE, current, 0.1) == [("val_general", 50.0, 61.0), ("val_news", 40.0, 47.0)]
    assert forgotten_sets(BASELINE, {"val_general/perplexity": 60.0}, 0.2) == []  # exactly +20%: not more
    assert forgotten_sets({}, current, 0.2) == []  # no step-0 value: nothing to compare


def _state(step: int, general_ppl: float, threshold: float | None = 0.2):
    trainer = SimpleNamespace(
        sanity_checking=False,
        global_step=step,
        callback_metrics={
            "val/perplexity": torch.tensor(90.0),
            "val_general/perplexity": torch.tensor(general_ppl),
        },
        datamodule=SimpleNamespace(forgetting=ForgettingOptions(warning=threshold)),
        state=SimpleNamespace(fn="fit"),
    )
    return trainer, SimpleNamespace(baseline_metrics=dict(BASELINE))


def _warnings(callback, *states) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for trainer, module in states:
            callback.on_validation_end(trainer, module)
    return [str(w.message) for w in caught]


def test_warns_once_per_set_naming_the_key_and_values():
    messages = _warnings(ForgettingWarning(), _state(10, 55.0), _state(20, 70.0), _state(30, 80.0))
    assert len(messages) == 1
    assert "val_general/perplexity" in messages[0] and "forgetting.warning=0.2" in messages[0]
    assert "50" in messages[0] and "70" in messages[0]


def test_off_without_threshold_and_explicit_threshold_wins():
    assert _warnings(ForgettingWarning(), _state(10, 500.0, threshold=None)) == []
    assert len(_warnings(ForgettingWarning(threshold=0.5), _state(10, 70.0, threshold=None))) == 0
    assert len(_warnings(ForgettingWarning(threshold=0.3), _state(10, 70.0, threshold=None))) == 1


def test_warned_sets_survive_a_resume():
    callback = ForgettingWarning()
    assert len(_warnings(callback, _state(10, 70.0))) == 1
    resumed = ForgettingWarning()
    resumed.load_state_dict(callback.state_dict())
    assert _warnings(resumed, _state(20, 90.0)) == []


def test_threshold_must_be_positive():
    with pytest.raises(MLMAdaptError, match=r"forgetting\.warning"):
        ForgettingWarning(threshold=-0.1)
