"""Every option of every command, read from the command's own parser, given hostile values of its type:
status 0 or one ``mlm_adapt: error:`` line naming the option, never a traceback.

The default run parses one value per option (the value chosen by a rotation over its hostile values, so
that different options meet different values): every option of fit, fill-mask, export and plot and the
options of the other commands that fit lacks, and a rotating sixth of the trainer/model/data/export/
downstream options they share with fit; the slow run parses every value of every option of every
command (``pytest -m slow tests/adversarial/test_every_option.py``). Values that parse
then meet the command's own checks: for the cheap commands every such value, for the training commands
a rotating sample, in process.
"""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

import pytest

from mlm_adapt.errors import user_message

sys.path.insert(0, str(Path(__file__).parent))
from option_values import Option, command_names, command_parser, hostile_values, options  # noqa: E402

COMMANDS = command_names()
# What each command needs besides the option under test (its positionals and required options).
REQUIRED = {
    "fill-mask": ["好[MASK]", "--model", "m"],
    "export": ["--ckpt_path", "a.ckpt", "--output_dir", "o"],
    "plot": ["run"],
}
# Tests may set it to rotate the default run's choice of values (the slow run takes all of them).
ROTATION = int(os.environ.get("MLM_ADAPT_OPTION_ROTATION", "0"))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A directory, a dangling symlink and an empty file for the path values."""
    root = tmp_path_factory.mktemp("hostile")
    (root / "adir").mkdir()
    (root / "dangling").symlink_to(root / "nowhere" / "target")
    (root / "empty.txt").write_text("", encoding="utf-8")
    return root


def arguments(option: Option, value: str) -> list[str]:
    required = list(REQUIRED.get(option.command, []))
    if option.positional:
        return [value, *required[1:]]
    return [*required, f"{option.flag}={value}"]


def outcome(parser, option: Option, value: str) -> str | None:
    """``None`` when parsing ``value`` ends as the CLI promises (parsed, or one line naming the option),
    else what went wrong."""
    args = arguments(option, value)
    try:
        parser.parse_args(args)
    except SystemExit as stopped:  # --print_config prints and exits 0
        return None if stopped.code in (0, None) else f"exit {stopped.code} without a message"
    except Exception as exc:
        translated = user_message(exc)
        if translated is None:
            return f"traceback: {type(exc).__name__}: {str(exc)[:300]}"
        message, _ = translated
        names = (option.flag, option.dest, option.dest.rsplit(".", 1)[-1])
        if not any(name in message for name in names):
            return f"the line does not name {option.flag}: {message[:300]}"
    return None


def _chosen(option: Option, values: list[str]) -> list[str]:
    start = (zlib.crc32(option.id.encode()) + ROTATION) % len(values)
    return [values[start]]


# The sections every LightningCLI command shares with fit (the same classes, the same parser class): fit
# parses each of their options in every default run, the other commands a rotating sixth of them.
SHARED = ("trainer.", "model.", "data.", "export.", "downstream.")
SHARED_SAMPLE = 6


def _check_command(command: str, scratch: Path, every_value: bool) -> int:
    parser = command_parser(command)
    failures, count = [], 0
    for option in options(command, parser):
        shared = command != "fit" and option.dest.startswith(SHARED)
        if shared and not every_value and (zlib.crc32(option.id.encode()) + ROTATION) % SHARED_SAMPLE:
            continue
        values = hostile_values(option, scratch)
        for value in values if every_value else _chosen(option, values):
            count += 1
            problem = outcome(parser, option, value)
            if problem:
                failures.append(f"{option.id}={value!r}: {problem}")
    assert not failures, f"{len(failures)} of {count}:\n" + "\n".join(failures[:40])
    return count


@pytest.mark.parametrize("command", COMMANDS)
def test_one_hostile_value_of_every_option_parses_or_is_one_line(command, scratch):
    count = _check_command(command, scratch, every_value=False)
    assert count >= 5


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_every_hostile_value_of_every_option_parses_or_is_one_line(command, scratch):
    _check_command(command, scratch, every_value=True)


def test_every_command_and_option_is_covered():
    """The option list comes from the parsers: a command or option added later is covered as it is."""
    from mlm_adapt.cli.commands import COMMANDS as OTHERS

    assert set(COMMANDS) == {"fit", "validate", "test", *OTHERS}
    counts = {command: len(list(options(command, command_parser(command)))) for command in ("fit", "plot")}
    assert counts["fit"] > 100 and counts["plot"] >= 3, counts


def _run_main(args: list[str], capsys) -> tuple[int, str]:
    from mlm_adapt.cli.commands import main

    try:
        main(args)
        code = 0
    except SystemExit as stopped:
        code = stopped.code if isinstance(stopped.code, int) else 1
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "every_value", [pytest.param(True, marks=pytest.mark.slow), False], ids=["all", "one"]
)
@pytest.mark.parametrize("command", ["fill-mask", "plot"])
def test_values_that_parse_meet_the_commands_own_checks(
    command, every_value, scratch, tiny_model_dir, tmp_path, capsys, monkeypatch
):
    """The cheap commands run in process on the hostile values their parser accepts (the default run: one
    per option, by the rotation; the slow run: all): each ends in status 0 or one line (the training
    commands' own checks have their tests in tests/adversarial)."""
    monkeypatch.chdir(tmp_path)  # a relative value (an --output of "-1") is written there
    metrics = tmp_path / "run" / "metrics.csv"
    metrics.parent.mkdir()
    metrics.write_text("epoch,step,train/loss,val/loss\n0,1,7.5,\n0,2,7.4,7.3\n", encoding="utf-8")
    required = {
        "fill-mask": ["好[MASK]", "--model", str(tiny_model_dir)],
        "plot": [str(metrics.parent), "--output", str(tmp_path / "curves.png")],
    }[command]
    parser = command_parser(command)
    failures = []
    for option in options(command, parser):
        values = hostile_values(option, scratch)
        start = (zlib.crc32(option.id.encode()) + ROTATION) % len(values)
        parsed = []
        for value in values[start:] + values[:start]:
            args = [value, *required[1:]] if option.positional else [*required, f"{option.flag}={value}"]
            try:
                parser.parse_args(args)
            except (Exception, SystemExit):
                continue  # refused by the parser: the parse tests' concern
            parsed.append(args)
        for args in parsed if every_value else parsed[:1]:
            code, err = _run_main([command, *args], capsys)
            lines = [line for line in err.splitlines() if line.startswith("mlm_adapt: error:")]
            if "Traceback" in err or (code != 0 and len(lines) != 1):
                failures.append(f"{option.id}: {args!r}: exit {code}: {err[-300:]}")
    assert not failures, "\n".join(failures[:20])
