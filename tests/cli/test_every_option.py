"""Every option of every command, read from the command's own parser, given a value of the wrong type: one
``mlm_adapt: error:`` line naming the option, exit 2, nothing created. A new option is covered as it is.

Each command's parser is built once (as ``python -m mlm_adapt COMMAND`` builds it) and every value goes
through the CLI's own error report (``_report_user_errors``), with the parser's ``parse_args`` as the
command. Options whose type takes any text (a path, a name) have no wrong type: they are listed, and their
values are checked where the command uses them (tests/cli/test_cli_errors.py and the commands' tests).
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonargparse
import pytest

from mlm_adapt.cli.commands import COMMANDS, _report_user_errors, main
from mlm_adapt.cli.fit import MLMAdaptCLI

COMMAND_NAMES = [*MLMAdaptCLI.subcommands(), *COMMANDS]
# What each command needs besides the option under test (its positionals and required options).
REQUIRED = {
    "fill-mask": ["好[MASK]", "--model", "m"],
    "export": ["--ckpt_path", "a.ckpt", "--output_dir", "o"],
    "plot": ["run"],
}
# Actions that print and exit (help) rather than take a value.
NO_VALUE = ("_HelpAction", "_ActionHelpClassPath", "_ActionHelpClass", "_ActionPrintConfig", "ActionLink")
TEXT = (str, Path, type(None), typing.Any)
UNIONS = (typing.Union, types.UnionType)


@dataclass(frozen=True)
class Option:
    """One option (or positional argument) of one command."""

    flag: str  # ``--data.batch_size``; the dest for a positional
    dest: str
    hint: Any  # the type hint (ActionTypeHint), else argparse's ``type`` or None
    positional: bool
    kind: str  # the action's class name


class _Built(Exception):
    def __init__(self, parser: jsonargparse.ArgumentParser) -> None:
        self.parser = parser


def command_parser(command: str) -> jsonargparse.ArgumentParser:
    """The parser ``python -m mlm_adapt COMMAND`` parses with, captured at its ``parse_args`` (for fit,
    validate and test, the subcommand's parser)."""
    original = jsonargparse.ArgumentParser.parse_args

    def capture(self: jsonargparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Built(self)

    jsonargparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        main([command, *REQUIRED.get(command, [])])
    except _Built as built:
        parser = built.parser
    finally:
        jsonargparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    subcommands = parser._subcommands_action
    return subcommands._name_parser_map[command] if subcommands is not None else parser


def options(parser: jsonargparse.ArgumentParser) -> Iterator[Option]:
    """Every option and positional argument of ``parser`` that takes a value."""
    for action in parser._actions:
        kind = type(action).__name__
        if kind in NO_VALUE or isinstance(action, argparse._SubParsersAction):
            continue
        positional = not action.option_strings
        flag = action.dest if positional else max(action.option_strings, key=len).rstrip("+")
        hint = getattr(action, "_typehint", None) or action.type
        yield Option(flag, action.dest, hint, positional, kind)


def _leaves(hint: Any) -> set[Any]:
    """The leaf types of ``hint`` through Optional, Union and containers; ``"literal"`` for choices."""
    if isinstance(hint, list):  # a Callable's argument list
        return set().union(*map(_leaves, hint)) if hint else set()
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return {"literal"}
    if origin is None:
        return {hint}
    found = {origin}
    for arg in typing.get_args(hint):
        found |= _leaves(arg)
    return found


def wrong_value(option: Option, missing: Path) -> str | None:
    """A value of the wrong type for ``option``, or ``None`` where its type takes any text."""
    if option.kind in ("ActionConfigFile", "_ActionConfigLoad"):
        return str(missing)  # a config file that is not there
    if option.hint in (None, typing.Any):
        return None
    members = set(typing.get_args(option.hint)) if typing.get_origin(option.hint) in UNIONS else {option.hint}
    members.discard(type(None))
    if members & {str, Path}:
        return None
    containers = {typing.get_origin(member) for member in members}
    if containers == {list}:
        return "{a: 1}"  # a mapping for a list
    if containers == {dict}:
        return "[1, 2]"  # a list for a mapping
    if containers == {list, dict}:
        return "7"  # a number for a list or a mapping
    leaves = _leaves(option.hint)
    if leaves & {str, Path}:
        return None
    if any(isinstance(leaf, type) and leaf not in (int, float, bool, *TEXT) for leaf in leaves):
        return "no_such_module.NoSuchClass"  # a class or callable option
    if leaves & {int, float}:
        return "abc"
    if bool in leaves:
        return "maybe"
    if "literal" in leaves:
        return "no_such_choice"
    return None


def arguments(command: str, option: Option, value: str) -> list[str]:
    required = REQUIRED.get(command, [])
    if option.positional:
        return [value, *required[1:]]
    return [*required, f"{option.flag}={value}"]


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_a_wrong_type_for_every_option_is_one_line_naming_it(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a relative value that something wrote would land here
    monkeypatch.setenv("MLM_ADAPT_DEBUG", "0")
    parser = command_parser(command)
    capsys.readouterr()
    missing = tmp_path / "missing" / "config.yaml"
    failures, checked, text = [], 0, []
    for option in options(parser):
        value = wrong_value(option, missing)
        if value is None:
            text.append(option.flag)
            continue
        checked += 1
        with pytest.raises(SystemExit) as stopped:
            _report_user_errors(parser.parse_args, arguments(command, option, value), command)
        err = capsys.readouterr().err.strip().splitlines()
        names = (option.flag, option.dest, option.dest.rsplit(".", 1)[-1])
        if stopped.value.code != 2:
            failures.append(f"{option.flag}={value!r}: exit {stopped.value.code}: {err[-3:]}")
        elif len(err) != 1 or not err[0].startswith("mlm_adapt: error: "):
            failures.append(f"{option.flag}={value!r}: {len(err)} lines: {err[-3:]}")
        elif not any(name in err[0] for name in names):
            failures.append(f"{option.flag}={value!r}: the line does not name it: {err[0]}")
    assert not failures, f"{len(failures)} of {checked}:\n" + "\n".join(failures[:40])
    assert list(tmp_path.iterdir()) == []
    assert checked >= 1, text
