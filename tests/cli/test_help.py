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
