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
    card = _card(masking={"scheme": scheme}, train_files=["reviews.txt"])
    name, unit = SCHEME_DESCRIPTIONS[scheme]
    assert f"pretraining with {name} (mlm_adapt" in card
    assert _rows(card)["masking"].startswith(f"{name} ({unit})")
    others = [n for s, (n, _) in SCHEME_DESCRIPTIONS.items() if s != scheme and n not in name]
    assert not any(other in card for other in others), others


def test_the_card_names_the_segmenter_and_its_options():
    segmentation = {"segmenter": "jieba", "hmm": False, "opencc": "t2s", "user_dict": "terms.txt"}
    rows = _rows(_card(segmentation=segmentation, train_files=["a"]))
    assert (rows["segmenter"], rows["jieba HMM"], rows["segmented through OpenCC"]) == (
        "`jieba`",
        "false",
        "`t2s`",
    )
    assert rows["user dictionary"] == "`terms.txt`"


def test_a_prepared_run_names_the_directory_it_read_not_the_command_lines_files():
    rows = _rows(_card(prepared_dir="/shared/prepared/law", train_files=["never_read.txt"]))
    assert rows["training data"] == "the prepared directory `law` (`python -m mlm_adapt prepare`)"
    assert "never_read.txt" not in _card(prepared_dir="/shared/prepared/law", train_files=["never_read.txt"])
    assert _rows(_card(train_files=["a.txt", "b.txt"]))["training data"] == "`a.txt`, `b.txt`"


def test_the_card_names_files_by_their_last_part_never_a_path_of_the_machine(tmp_path):
    """The card goes to the Hub: a file, directory or pattern of the run is named by its last part (a
    pattern with its directory's name), a Hub id as it is; the checkpoint by its file name and step."""
    base = tmp_path / "models" / "chinese-bert"
    base.mkdir(parents=True)
    info = ExportInfo(
        model_hparams={"model_name_or_path": str(base)},
        data_hparams={
            "train_files": [f"{tmp_path}/med/*.txt", f"{tmp_path}/extra.txt"],
            "validation_files": {"domain": f"{tmp_path}/val.txt", "general": [f"{tmp_path}/gen/g.txt"]},
            "segmentation": {"segmenter": "jieba", "user_dict": f"{tmp_path}/terms.txt"},
            "replay": {"files": [f"{tmp_path}/general/*.txt"], "rate": 0.1},
        },
        source="best checkpoint by val/loss: step=30.ckpt (step 30)",
    )
    card = str(render_model_card(info, title="demo"))
    assert str(tmp_path) not in card
    rows = _rows(card)
    assert rows["training data"] == "`med/*.txt`, `extra.txt`"
    assert rows["validation data"] == "`val/*`: domain (`val.txt`); `val_general/*`: general (`g.txt`)"
    assert rows["user dictionary"] == "`terms.txt`"
    assert rows["general text replayed"].startswith("`general/*.txt`")
    assert "`chinese-bert` adapted to domain text" in card
    hub = ExportInfo(model_hparams={"model_name_or_path": "hfl/chinese-bert-wwm-ext"})
    assert "`hfl/chinese-bert-wwm-ext` adapted" in str(render_model_card(hub, title="demo"))


def test_the_card_states_replay_as_configured_and_the_budgets_trajectory():
    from mlm_adapt.data.replay import Replay, ReplayOptions, replay_summary

    assert "general text replayed" not in _rows(_card(train_files=["a"]))
    replayed = {"files": ["news.txt"], "rate": [[0.0, 0.0], [1.0, 0.3]]}
    fixed = _rows(_card(train_files=["a"], replay=replayed))
    assert fixed["general text replayed"] == (
        "`news.txt` at replay rate 0 at 0% -> 0.3 at 100% of the optimizer steps (piecewise linear)"
    )
    replay = Replay(general=[], schedule=ReplayOptions(rate=0.0).schedule, budget=0.2)
    for step, perplexity in [(0, 100.0), (10, 135.0), (20, 128.0), (30, 118.0)]:
        replay.update(step, perplexity)
    info = ExportInfo(
        model_hparams={"model_name_or_path": "tiny"},
        data_hparams={"train_files": ["a"], "replay": {"files": ["news.txt"]}, "forgetting": {"budget": 0.2}},
        replay=replay_summary(replay.state_dict()),
    )
    card = str(render_model_card(info, title="demo"))
    assert _rows(card)["general text replayed"].endswith("replay rate set by forgetting.budget=0.2")
    assert "## Forgetting budget" in card
    assert "3 check(s) ran after step 0, the last at step 30, where it was +18.0%: the budget held" in card
    table = [line for line in card.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert table == [f"| {c.step} | {c.perplexity / 100 - 1:+.1%} | {c.rate:g} |" for c in replay.checks]


SEGMENTERS = {
    "rjieba": ("rjieba", "`rjieba`"),
    "thulac": ("thulac", "`thulac`"),
    "class_path": ({"class_path": "my.Segmenter", "init_args": {"longest": 3}}, "`my.Segmenter(longest=3)`"),
}
SCHEDULES = {"constant": 0.15, "decay": [[0.0, 0.3], [1.0, 0.15]]}
REPLAY = {
    "none": {},
    "fixed": {"replay": {"files": ["news.txt"], "rate": 0.1}},
    "budget": {"replay": {"files": ["news.txt"]}, "forgetting": {"budget": 0.2}},
}


@pytest.mark.parametrize("replay", list(REPLAY))
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("segmenter", list(SEGMENTERS))
@pytest.mark.parametrize("scheme", list(SCHEME_DESCRIPTIONS))
def test_every_sentence_follows_from_the_runs_settings(scheme, segmenter, schedule, replay):
    from huggingface_hub import ModelCard

    from mlm_adapt.masking.schedule import parse_schedule

    spec, shown = SEGMENTERS[segmenter]
    data = {
        "masking": {"scheme": scheme, "mlm_probability": SCHEDULES[schedule], "eval_mlm_probability": 0.15},
        "segmentation": {"segmenter": spec, "hmm": False, "user_dict": None},
        "train_files": ["domain.txt"],
        **REPLAY[replay],
    }
    info = ExportInfo(model_hparams={"model_name_or_path": "tiny"}, data_hparams=data, model_type="bert")
    card = str(render_model_card(info, title="demo"))
    rows = _rows(card)
    name, unit = SCHEME_DESCRIPTIONS[scheme]
    # Masking: the scheme the run used, in the text and in the Hub tags, and no other.
    assert f"pretraining with {name} (mlm_adapt" in card and rows["masking"].startswith(f"{name} ({unit})")
    assert not [n for s, (n, _) in SCHEME_DESCRIPTIONS.items() if s != scheme and n not in name and n in card]
    tags = ModelCard(card).data.tags
    assert ("whole-word-masking" in tags) == (scheme != "token") and ("ngram-masking" in tags) == (
        scheme == "ngram"
    )
    assert tags[0] == "bert"
    # Validation masks whole words at its own rate: "as training did" only when training did too.
    same = scheme == "whole_word" and schedule == "constant"
    assert ("Validation masks whole words at rate 0.15, as training did." in card) == same
    if not same:
        assert (
            f"whatever the training, which used {name} at {parse_schedule(SCHEDULES[schedule]).describe()}."
            in card
        )
    # Segmenter: its name or class path; the jieba options only where jieba segments.
    assert rows["segmenter"] == shown
    jieba = segmenter == "rjieba"
    assert ("jieba HMM" in rows) == jieba and ("user dictionary" in rows) == jieba
    # Schedule and replay as configured.
    assert rows["mlm_probability"] == parse_schedule(SCHEDULES[schedule]).describe()
    replayed = rows.get("general text replayed")
    expected_replay = {
        "none": None,
        "fixed": "`news.txt` at replay rate 0.1",
        "budget": "`news.txt`, replay rate set by forgetting.budget=0.2",
    }[replay]
    assert replayed == expected_replay
    assert "downstream/<task>" not in card and "val_<name>" not in card  # none of either in this run


def test_a_token_masking_fit_exports_a_card_without_whole_word_masking(tiny_model_dir, corpus_file, tmp_path):
    """Through the CLI, as a user runs it: the tags and the text follow ``--data.masking.scheme token``."""
    from conftest import tiny_fit_args
    from huggingface_hub import ModelCard

    from mlm_adapt.cli.commands import main

    args = tiny_fit_args(
        tiny_model_dir, corpus_file, tmp_path, "--data.masking.scheme=token", "--trainer.max_steps=2"
    )
    main(["fit", *args, f"--export.output_dir={tmp_path / 'export'}", "--trainer.logger=false"])
    card = ModelCard.load(tmp_path / "export" / "README.md")
    assert "whole-word-masking" not in card.data.tags and card.data.tags[0] == "bert"
    text = card.text
    assert "pretraining with token-level masking" in text and "whole-word masking" not in text
    assert "whatever the training, which used token-level masking at 0.15." in text


@pytest.mark.parametrize("pretrained", [True, False])
def test_a_random_init_is_stated_as_such_and_its_scores_not_called_the_bases(pretrained):
    """model.pretrained false: the card said the Hub model was "adapted by continued masked-language-model
    pretraining" and headed a random network's scores "before (step 0, `hfl/chinese-bert-wwm-ext`)"."""
    info = ExportInfo(
        model_hparams={"model_name_or_path": "hfl/chinese-bert-wwm-ext", "pretrained": pretrained},
        data_hparams={"train_files": ["law.txt"]},
        baseline_metrics={"val/loss": 9.9, "val/perplexity": 19930.0},
        final_metrics={"val/loss": 6.1, "val/perplexity": 445.9},
        final_metrics_step=100,
    )
    card = str(render_model_card(info, title="demo"))
    base = "`hfl/chinese-bert-wwm-ext`"
    adapted = f"{base} adapted to domain text by continued masked-language-model pretraining"
    if pretrained:
        assert adapted in card and f"| metric | before (step 0, {base}) | after (step 100) |" in card
        assert "base_model: hfl/chinese-bert-wwm-ext" in card
        return
    assert adapted not in card and "continued" not in card and "adapted" not in card
    assert "randomly initialized (none of its weights) and pretrained from scratch" in card
    assert "| metric | before (step 0, random init) | after (step 100) |" in card
    assert "base_model" not in card
