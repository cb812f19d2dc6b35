"""Command-line and config errors: exactly one ``mlm_adapt: error: ...`` line with a ``--help`` hint, exit 2,
never jsonargparse's usage dump."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from mlm_adapt.cli.commands import main


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# name: (arguments (tmp_path -> list), text the line must hold, the --help hint's command or None for none)
CASES = {
    "fit_bad_int": (lambda t: ["fit", "--trainer.max_steps", "abc"], "trainer.max_steps", "fit"),
    "fit_float_overflow": (
        lambda t: ["fit", "--model.warmup", "1" + "0" * 400],
        "a number on the command line or in the config is too large",
        "fit",
    ),
    "plot_binary_config": (
        lambda t: ["plot", "run", "--config", str(t / "c.png")],
        "--config: {t}/c.png is not UTF-8 text; give a YAML file",
        None,
    ),
    "fit_unknown_flag": (lambda t: ["fit", "--nosuch", "1"], "unrecognized arguments: --nosuch", "fit"),
    "fit_flag_without_value": (
        lambda t: ["fit", "--model.model_name_or_path"],
        "expected one argument",
        "fit",
    ),
    "fit_missing_config": (lambda t: ["fit", "--config", str(t / "none.yaml")], "does not exist", "fit"),
    "fit_config_unknown_key": (
        lambda t: ["fit", "--config", write(t, "c.yaml", "trainer:\n  nosuch_key: 1\n")],
        "nosuch_key",
        "fit",
    ),
    "fit_config_not_a_mapping": (
        lambda t: ["fit", "--config", write(t, "c.yaml", "- just\n- a list\n")],
        "config",
        "fit",
    ),
    "validate_bad_bool": (
        lambda t: ["validate", "--trainer.fast_dev_run", "maybe"],
        "fast_dev_run",
        "validate",
    ),
    # A key the parser fills in from another (a link target) was dropped without a word from a config.
    "fit_config_linked_group": (
        lambda t: ["fit", "--config", write(t, "c.yaml", "data:\n  forgetting:\n    warning: 0.3\n")],
        "data.forgetting: it is set from forgetting; give forgetting instead",
        None,
    ),
    "fit_config_linked_key_under_fit": (
        lambda t: ["--config", write(t, "c.yaml", "fit:\n  data:\n    max_seq_length: 77\n"), "fit"],
        "fit.data.max_seq_length: it is set from model.max_seq_length; give model.max_seq_length instead",
        None,
    ),
    "fit_inline_group_linked_key": (
        lambda t: ["fit", "--data", '{"tokenizer_name_or_path": "other"}'],
        "data.tokenizer_name_or_path: it is set from model.model_name_or_path",
        None,
    ),
    "unknown_command": (lambda t: ["frobnicate"], "invalid choice", ""),
    "fill_mask_missing_arguments": (lambda t: ["fill-mask"], "required", "fill-mask"),
    "export_unknown_flag": (lambda t: ["export", "--bogus"], "unrecognized arguments", "export"),
    "vocab_bad_int": (lambda t: ["vocab", "--top_k", "many"], "top_k", "vocab"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_parser_error_is_one_line(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["mlm_adapt"])  # as from a shell: no pytest arguments to warn about
    (tmp_path / "c.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    build, expected, command = CASES[case]
    with pytest.raises(SystemExit) as stopped:
        main(build(tmp_path))
    captured = capsys.readouterr()
    assert stopped.value.code == 2, captured.err[-2000:]
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err[-2000:]  # no usage dump
    (line,) = lines
    assert line.startswith("mlm_adapt: error: ") and expected.format(t=tmp_path) in line, line
    assert "usage:" not in captured.err and len(line) < 600
    if command is not None:
        hint = " ".join(["python -m mlm_adapt", *command.split(), "--help"])
        assert line.endswith(f"({hint} for usage)"), line


def test_debug_keeps_the_parser_traceback(monkeypatch):
    monkeypatch.setenv("MLM_ADAPT_DEBUG", "0")  # restored after --debug sets it
    with pytest.raises(argparse.ArgumentError, match="unrecognized arguments"):
        main(["fit", "--nosuch", "1", "--debug"])


def test_help_still_prints_usage(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["fill-mask", "--help"])
    assert stopped.value.code == 0 and "--top_k" in capsys.readouterr().out
