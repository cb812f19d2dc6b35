"""Everything checkable is checked before work: the Hub repository id, ``export.monitor`` against what the
run logs, a fit that trains no step, a model too large for the memory or whose weights disagree with its
config.json, numeric settings out of range. Each case is refused with one ``mlm_adapt: error:`` line,
exit 2, before any step, checkpoint or export is written."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest
from conftest import tiny_fit_args
from families import family_dir

from mlm_adapt.cli.commands import main
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.export.callback import check_monitor, logged_metrics
from mlm_adapt.export.options import check_repo_id


def run_main(args: list[str], capsys) -> tuple[int, list[str]]:
    """Exit code and the ``mlm_adapt: error:`` lines of stderr (progress output aside); the error, when
    there is one, is the last line and no traceback precedes it."""
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.startswith("mlm_adapt: error:")]
    assert "Traceback" not in err and (not lines or err.strip().splitlines()[-1] == lines[-1])
    return info.value.code, lines


def written(root: Path) -> list[str]:
    """What a run left under ``root``, besides the datasets cache."""
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if "hf_cache" not in p.parts)


@pytest.fixture
def corpus(tmp_path, review_texts) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(review_texts[:120]) + "\n", encoding="utf-8")
    return path


def fit_args(model_dir: Path, corpus: Path, root: Path, *extra: str) -> list[str]:
    return ["fit", *tiny_fit_args(model_dir, corpus, root, f"--export.output_dir={root / 'export'}", *extra)]


# ---------------------------------------------------------------- Hub repository id


def test_fit_refuses_a_bad_repo_id_before_training(tiny_model_dir, corpus, tmp_path, capsys):
    root = tmp_path / "run"
    repo_id = "../../etc"
    args = fit_args(tiny_model_dir, corpus, root, "--export.push_to_hub=true", f"--export.repo_id={repo_id}")
    code, lines = run_main(args, capsys)
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith(f"mlm_adapt: error: export.repo_id={repo_id!r} is no Hub repository id")
    assert written(root) == []


@pytest.mark.parametrize(
    "asked, option",
    [
        ("--export.push_to_hub=true --export.repo_id=me/model", "export.push_to_hub"),
        ("--export.merge_alpha=0.5", "export.merge_*"),
    ],
)
def test_fit_refuses_a_push_or_merge_without_an_export(
    asked, option, tiny_model_dir, corpus, tmp_path, capsys
):
    root = tmp_path / "run"
    code, lines = run_main(
        fit_args(tiny_model_dir, corpus, root, "--export.checkpoint=none", *asked.split()), capsys
    )
    assert code == 2 and lines == [
        f"mlm_adapt: error: {option} needs an export, but export.checkpoint is none; set it to best or last"
    ]
    assert written(root) == []


REVISION_CASES = {
    "a field other than step": (
        ["--export.revision=x-{epoch}"],
        "export.revision='x-{epoch}': the one field a branch name may hold is {step}, e.g. step-{step}",
    ),
    "a branch per checkpoint, no checkpoint": (
        ["--export.revision=step-{step}", "--trainer.enable_checkpointing=false"],
        "export.revision='step-{step}' pushes each checkpoint the fit saves, but it saves none; add a "
        "ModelCheckpoint to trainer.callbacks (every_n_train_steps: how often) or drop {step}",
    ),
}


@pytest.mark.parametrize("case", list(REVISION_CASES))
def test_fit_refuses_a_revision_it_cannot_push_to_before_training(
    case, tiny_model_dir, corpus, tmp_path, capsys
):
    extra, line = REVISION_CASES[case]
    root = tmp_path / "run"
    push = ["--export.push_to_hub=true", "--export.repo_id=me/model", *extra]
    code, lines = run_main(fit_args(tiny_model_dir, corpus, root, *push), capsys)
    assert (code, lines) == (2, [f"mlm_adapt: error: {line}"])
    assert not any(name.endswith((".ckpt", "metrics.csv")) for name in written(root))
    assert not (root / "export").exists()


@pytest.mark.parametrize("repo_id", ["me/model", "org-1/chinese_bert.v2", "name"])
def test_good_repo_ids_pass(repo_id):
    check_repo_id(repo_id)


# ---------------------------------------------------------------- export.monitor

LOGGED = logged_metrics(
    ["validation", "news"], [("sentiment", "sequence_classification"), ("ner", "token_classification")]
)
MONITOR_CASES = {
    # name: (monitor, suggestion or None when accepted)
    "val_loss": ("val/loss", None),
    "task_score": ("downstream/sentiment/macro_f1", None),
    "own_callback_metric": ("custom/score", None),
    "typo_los": ("val/los", "val/loss"),
    "unknown_set": ("val_new/loss", "val_news/loss"),
    "unknown_task": ("downstream/sentimnet/macro_f1", "downstream/sentiment/macro_f1"),
    "val_metric_not_logged": ("val/f1", None),
}


@pytest.mark.parametrize("case", list(MONITOR_CASES), ids=list(MONITOR_CASES))
def test_monitor_is_checked_against_what_the_run_logs(case):
    monitor, suggestion = MONITOR_CASES[case]
    refused = suggestion is not None or case == "val_metric_not_logged"
    if not refused:
        check_monitor(monitor, LOGGED)
        return
    with pytest.raises(MLMAdaptError) as info:
        check_monitor(monitor, LOGGED)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"export.monitor={monitor!r} is not a metric")
    if suggestion:
        assert f"did you mean {suggestion!r}?" in message


def test_fit_refuses_a_monitor_typo_before_training(tiny_model_dir, corpus, tmp_path, capsys):
    root = tmp_path / "run"
    code, lines = run_main(fit_args(tiny_model_dir, corpus, root, "--export.monitor=val/los"), capsys)
    assert code == 2 and len(lines) == 1 and "did you mean 'val/loss'?" in lines[0]
    assert not any(name.endswith((".ckpt", "metrics.csv")) for name in written(root))
    assert not (root / "export").exists()


# ---------------------------------------------------------------- a fit that trains nothing


def test_fit_max_steps_0_exports_nothing(tiny_model_dir, corpus, tmp_path, capsys):
    root = tmp_path / "run"
    code, lines = run_main(fit_args(tiny_model_dir, corpus, root, "--trainer.max_steps=0"), capsys)
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith("mlm_adapt: error: trainer.max_steps=0 trains no step")
    assert not (root / "export").exists()


# ---------------------------------------------------------------- model sizes and model directories


def _edited_copy(source: Path, target: Path, **changes) -> Path:
    """A copy of a model directory whose config.json says ``changes`` (its weights stay as they were)."""
    shutil.copytree(source, target)
    path = target / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**config, **changes}), encoding="utf-8")
    return target


MODEL_DIR_CASES = {
    # name: (config.json changes, extra flags, what the line says)
    "absurd_vocab_random_init": (
        {"vocab_size": 1_000_000_000, "hidden_size": 768, "intermediate_size": 3072},
        ["--model.pretrained=false"],
        "B parameters (vocab_size 1000000000, hidden_size 768",
    ),
    "absurd_depth_pretrained": (
        {"num_hidden_layers": 1_000_000, "hidden_size": 768, "intermediate_size": 3072},
        [],
        "config.json describes ",
    ),
    "config_vocab_edited": ({"vocab_size": 4321}, [], "model.safetensors and "),
}


@pytest.mark.parametrize("case", list(MODEL_DIR_CASES), ids=list(MODEL_DIR_CASES))
def test_fit_refuses_a_model_dir_before_work(case, corpus, tmp_path, capsys):
    changes, extra, expected = MODEL_DIR_CASES[case]
    model_dir = _edited_copy(family_dir("bert"), tmp_path / "model", **changes)
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model_dir.iterdir())}
    root = tmp_path / "run"
    started = time.monotonic()
    code, lines = run_main(fit_args(model_dir, corpus, root, *extra), capsys)
    assert code == 2 and len(lines) == 1, lines
    assert (
        lines[0].startswith(f"mlm_adapt: error: model.model_name_or_path: {model_dir}")
        and expected in lines[0]
    )
    if expected.startswith("model.safetensors"):  # both files named, then the tensor and its two shapes
        assert "config.json disagree: tensor '" in lines[0] and "in the weights but [" in lines[0]
    assert time.monotonic() - started < 30
    assert written(root) == [] and not (root / "hf_cache").exists()  # no dataset prepared
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model_dir.iterdir())} == before


# ---------------------------------------------------------------- numeric settings

# Values a library accepts and then divides by, or silently reads as another value.
NUMERIC_CASES = {
    "accumulate_grad_batches_0": ("--trainer.accumulate_grad_batches=0", "must be at least 1"),
    "warmup_nan": ("--model.warmup=nan", 'Parser key "model.warmup"'),
    "lr_nan": ("--model.optimizer=torch.optim.AdamW --model.optimizer.lr=nan", "lr"),
}


@pytest.mark.parametrize("case", list(NUMERIC_CASES), ids=list(NUMERIC_CASES))
def test_fit_refuses_a_numeric_setting_out_of_range_before_work(
    case, tiny_model_dir, corpus, tmp_path, capsys
):
    setting, expected = NUMERIC_CASES[case]
    root = tmp_path / "run"
    code, lines = run_main(fit_args(tiny_model_dir, corpus, root, *setting.split()), capsys)
    assert code == 2 and len(lines) == 1 and expected in lines[0], lines
    assert written(root) == []
