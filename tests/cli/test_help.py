"""What ``fit``/``validate``/``test --help`` shows a user: mlm_adapt's own options first, each group under a
one-line heading, the Trainer's last, and no Lightning flag that cannot work with this tool."""

from __future__ import annotations

import contextlib
import io
import re

import pytest
from conftest import run_main

from mlm_adapt.cli.fit import GROUP_HEADINGS, MLMAdaptCLI

OWN_GROUPS = ("model", "data", "forgetting", "export", "downstream")


@pytest.fixture(scope="module", params=["fit", "validate", "test"])
def help_text(request) -> str:
    """The command's help, rendered (not read from the help cache) once for the module's tests."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as info:
        MLMAdaptCLI(args=[request.param, "--help"])
    assert info.value.code == 0
    return out.getvalue()


def _first_line(lines: list[str], pattern: str) -> int:
    return next(i for i, line in enumerate(lines) if re.match(pattern, line))


def test_own_options_come_first_and_the_trainers_last(help_text):
    lines = help_text.splitlines()
    first_own = _first_line(lines, r"\s+--model\.model_name_or_path ")
    assert first_own < 40, "\n".join(lines[:first_own])
    first_trainer = _first_line(lines, r"\s+--trainer\.")
    for group in OWN_GROUPS:
        assert _first_line(lines, rf"\s+--{group}\.") < first_trainer, group
    # Every group under its one-line heading, in the order of GROUP_HEADINGS.
    headings = [line for line in lines if line.endswith(":") and not line.startswith(" ")]
    assert headings == [f"{text}:" for text in GROUP_HEADINGS.values()]


def test_the_own_options_stay_few(help_text):
    """A user reads every own option: at most 72 (model, data, forgetting, export, downstream), at most 15
    of them ``data.*`` outside its groups; a group's config path and ``--*.help`` are no options."""
    own = re.findall(rf"^  --((?:{'|'.join(OWN_GROUPS)})\.[\w.]+) (?!CONFIG)", help_text, flags=re.M)
    own = [name for name in own if not name.endswith(".help")]
    assert len(own) == len(set(own)) and len(own) <= 72, len(own)
    data_ungrouped = [name for name in own if name.startswith("data.") and name.count(".") == 1]
    assert len(data_ungrouped) <= 15, data_ungrouped


def test_no_lightning_flag_that_cannot_work_is_shown(help_text):
    assert "--weights_only" not in help_text  # checkpoints are always read weights-only
    assert "registry" not in help_text  # neither --ckpt_path registry nor --trainer.model_registry
    assert "``last``" in help_text and "``hpc``" in help_text


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--weights_only", "false"], "unrecognized arguments: --weights_only false"),
        (["--ckpt_path", "registry"], "ckpt_path registry: Lightning's model registry is not used"),
        (["--ckpt_path", "registry:my-model:version:v2"], "ckpt_path registry:my-model:version:v2: "),
    ],
)
def test_a_lightning_flag_this_tool_has_no_use_for_is_one_line(flags, expected, tmp_path, capsys):
    code, _, err = run_main(["fit", "--trainer.default_root_dir", str(tmp_path), *flags], capsys)
    lines = [line for line in err.splitlines() if line.startswith("mlm_adapt: error:")]
    assert code == 2 and len(lines) == 1 and expected in lines[0], err
    assert "Traceback" not in err


# Each option renamed into its group (docs/changelog.md): the old name is no option, in one line.
RENAMED = {
    "data.segmenter": "data.segmentation.segmenter",
    "data.hmm": "data.segmentation.hmm",
    "data.user_dict": "data.segmentation.user_dict",
    "data.opencc": "data.segmentation.opencc",
    "data.mlm_probability": "data.masking.mlm_probability",
    "data.eval_mlm_probability": "data.masking.eval_mlm_probability",
    "data.mask_replace_prob": "data.masking.mask_replace_prob",
    "data.random_replace_prob": "data.masking.random_replace_prob",
    "data.masking": "data.masking.scheme",
    "data.packing": "data.blocks.packing",
    "data.document_attention": "data.blocks.document_attention",
    "data.group_by_length": "data.blocks.group_by_length",
    "data.mix_files": "data.replay.files",
    "data.mix_probability": "data.replay.rate",
    "data.max_mix_rate": "forgetting.max_replay_rate",
    "data.streaming": "data.streaming.enabled",
    "data.shuffle_buffer_size": "data.streaming.shuffle_buffer_size",
    "data.streaming_validation_documents": "data.streaming.validation_documents",
    "export.enabled": "export.checkpoint",
}


def test_every_renamed_option_is_in_the_help_under_its_new_name_only(help_text):
    for old, new in RENAMED.items():
        assert f"--{new} " in help_text, new
        if old != "data.masking" and old != "data.streaming":  # now the groups' own config options
            assert f"--{old} " not in help_text, old


@pytest.mark.parametrize("old", list(RENAMED))
def test_an_old_name_is_an_unknown_option_in_one_line(old, tmp_path, capsys):
    value = "true" if old in ("data.streaming", "data.packing", "data.hmm") else "0.1"
    config = tmp_path / "old.yaml"
    section, key = old.split(".")
    config.write_text(f"{section}:\n  {key}: {value}\n", encoding="utf-8")
    for args in (["fit", f"--{old}", value], ["fit", "--config", str(config)]):
        code, _, err = run_main(args, capsys)
        lines = [line for line in err.splitlines() if line.startswith("mlm_adapt: error:")]
        assert code == 2 and len(lines) == 1, err
        assert old in lines[0] or key in lines[0], lines[0]


# Options that are gone (docs/changelog.md says what replaces each).
REMOVED = (
    "model.mask_attention",
    "model.compile_options",
    "downstream.cache_dir",
    "downstream.max_length",
    "downstream.batch_size",
    "downstream.probe_l2",
    "downstream.bootstrap",
    "data.pad_to_multiple_of",
    "data.blocks.pad_to_multiple_of",
    "export.verify",
    "export.commit_message",
    "model.log_throughput",
)


def test_no_removed_option_is_in_the_help(help_text):
    assert not [old for old in REMOVED if f"--{old} " in help_text]


@pytest.mark.parametrize("old", REMOVED)
def test_a_removed_option_is_unknown_in_one_line(old, capsys):
    code, _, err = run_main(["fit", f"--{old}", "1"], capsys)
    lines = [line for line in err.splitlines() if line.startswith("mlm_adapt: error:")]
    assert code == 2 and len(lines) == 1 and f"--{old}" in lines[0], err
