"""Every claim of the model card follows from the run's settings: masking scheme, corpus, segmenter."""

from __future__ import annotations

import pytest

from mlm_adapt.export.card import ExportInfo, render_model_card
from mlm_adapt.masking.collator import SCHEME_DESCRIPTIONS


def _card(**data) -> str:
    info = ExportInfo(model_hparams={"model_name_or_path": "tiny"}, data_hparams=data)
    return str(render_model_card(info, title="demo"))


def _rows(card: str) -> dict[str, str]:
    return dict(
        line[2:].split(": ", 1) for line in card.splitlines() if line.startswith("- ") and ": " in line
    )


@pytest.mark.parametrize("scheme", list(SCHEME_DESCRIPTIONS))
def test_the_card_names_the_masking_scheme_the_run_used(scheme):
    card = _card(masking=scheme, train_files=["reviews.txt"])
    name, unit = SCHEME_DESCRIPTIONS[scheme]
    assert f"pretraining with {name} (mlm_adapt" in card
    assert _rows(card)["masking"].startswith(f"{name} ({unit})")
    others = [n for s, (n, _) in SCHEME_DESCRIPTIONS.items() if s != scheme and n not in name]
    assert not any(other in card for other in others), others


def test_the_card_names_the_segmenter_and_its_options():
    rows = _rows(_card(segmenter="thulac", hmm=False, opencc="t2s", user_dict="terms.txt", train_files=["a"]))
    assert (rows["segmenter"], rows["jieba HMM"], rows["segmented through OpenCC"]) == (
        "`thulac`",
        "false",
        "`t2s`",
    )
    assert rows["user dictionary"] == "`terms.txt`"


def test_a_prepared_run_names_the_directory_it_read_not_the_command_lines_files():
    rows = _rows(_card(prepared_dir="/shared/prepared/law", train_files=["never_read.txt"]))
    assert (
        rows["training data"]
        == "the prepared directory `/shared/prepared/law` (`python -m mlm_adapt prepare`)"
    )
    assert "never_read.txt" not in _card(prepared_dir="/shared/prepared/law", train_files=["never_read.txt"])
    assert _rows(_card(train_files=["a.txt", "b.txt"]))["training data"] == "`a.txt`, `b.txt`"


def test_the_card_states_replay_as_configured_and_the_budgets_trajectory():
    from mlm_adapt.data.replay import Replay, parse_mix_rate, replay_summary

    assert "general text replayed" not in _rows(_card(train_files=["a"]))
    fixed = _rows(_card(train_files=["a"], mix_files=["news.txt"], mix_probability=[[0.0, 0.0], [1.0, 0.3]]))
    assert fixed["general text replayed"] == (
        "`news.txt` at mix rate 0 at 0% -> 0.3 at 100% of the optimizer steps (piecewise linear)"
    )
    replay = Replay(general=[], schedule=parse_mix_rate(0.0), budget=0.2)
    for step, perplexity in [(0, 100.0), (10, 135.0), (20, 128.0), (30, 118.0)]:
        replay.update(step, perplexity)
    info = ExportInfo(
        model_hparams={"model_name_or_path": "tiny"},
        data_hparams={"train_files": ["a"], "mix_files": ["news.txt"], "forgetting_budget": 0.2},
        replay=replay_summary(replay.state_dict()),
    )
    card = str(render_model_card(info, title="demo"))
    assert _rows(card)["general text replayed"].endswith("mix rate set by data.forgetting_budget=0.2")
    assert "## Forgetting budget" in card and "at the last check it was +18.0%: the budget held" in card
    table = [line for line in card.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert table == [f"| {c.step} | {c.perplexity / 100 - 1:+.1%} | {c.rate:g} |" for c in replay.checks]
