"""Every option of every command, read from the parsers themselves, and hostile values of each one's type
(for ``test_every_option``): a new option is covered without a new test."""

from __future__ import annotations

import argparse
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonargparse

# Actions that print and exit (help) rather than take a value.
_NO_VALUE = ("_HelpAction", "_ActionHelpClassPath", "_ActionHelpClass")


@dataclass(frozen=True)
class Option:
    """One option (or positional argument) of one command."""

    command: str
    flag: str  # ``--data.batch_size``; the dest for a positional
    dest: str
    hint: Any  # the type hint (ActionTypeHint), else argparse's ``type`` or None
    positional: bool
    kind: str  # the action's class name

    @property
    def id(self) -> str:
        return f"{self.command} {self.flag}"


class _Built(Exception):
    def __init__(self, parser: jsonargparse.ArgumentParser) -> None:
        self.parser = parser


def command_parser(command: str) -> jsonargparse.ArgumentParser:
    """The parser ``python -m mlm_adapt COMMAND`` parses with, as the command builds it (captured at its
    ``parse_args``; for fit/validate/test, the subcommand's parser)."""
    from mlm_adapt.cli.commands import main

    original = jsonargparse.ArgumentParser.parse_args

    def capture(self, *args: Any, **kwargs: Any) -> Any:
        raise _Built(self)

    jsonargparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        main([command])
    except _Built as built:
        parser = built.parser
    finally:
        jsonargparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    subcommands = parser._subcommands_action  # noqa: SLF001 (jsonargparse's own record)
    return subcommands._name_parser_map[command] if subcommands is not None else parser


def command_names() -> list[str]:
    from mlm_adapt.cli.commands import COMMANDS
    from mlm_adapt.cli.fit import MLMAdaptCLI

    return [*MLMAdaptCLI.subcommands(), *COMMANDS]


def options(command: str, parser: jsonargparse.ArgumentParser) -> Iterator[Option]:
    """Every option and positional argument of ``parser`` that takes a value."""
    for action in parser._actions:  # noqa: SLF001
        kind = type(action).__name__
        if kind in _NO_VALUE or kind == "ActionLink" or isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            continue
        positional = not action.option_strings
        flag = action.dest if positional else max(action.option_strings, key=len).rstrip("+")
        hint = getattr(action, "_typehint", None) or action.type
        yield Option(command, flag, action.dest, hint, positional, kind)


def _parts(hint: Any) -> set[Any]:
    """The leaf types of ``hint`` (through Optional, Union, list[...], Literal values' types)."""
    if isinstance(hint, list):  # Callable's argument list
        return set().union(*map(_parts, hint)) if hint else set()
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return {"literal"}
    if origin is None:
        return {hint}
    found = {origin}
    for arg in typing.get_args(hint):
        found |= _parts(arg)
    return found


def hostile_values(option: Option, scratch: Path) -> list[str]:
    """Hostile values of ``option``'s type: empty, negative, zero, NaN/inf, huge, the wrong type, non-ASCII
    digits; for paths (every string option may be one) a directory, a dangling symlink and a missing path."""
    parts = _parts(option.hint)
    values = ["", "²", "١٢", "[1, {"]  # empty, a non-decimal digit, Arabic-Indic digits, broken YAML
    numeric = parts & {int, float}
    if numeric:
        values += ["-1", "0", "nan", "inf", "-inf", "1" + "0" * 400, "abc", "1e400"]
    if bool in parts:
        values += ["maybe", "2"]
    if "literal" in parts:
        values += ["no_such_choice"]
    if parts & {str, Path} or option.hint is None or option.kind in ("ActionConfigFile", "_ActionConfigLoad"):
        missing = scratch / "missing" / "file.txt"
        values += [str(missing), str(scratch / "adir"), str(scratch / "dangling"), str(scratch / "empty.txt")]
    if parts & {list, dict, typing.Sequence, typing.Iterable} or typing.get_origin(option.hint) in (
        list,
        dict,
    ):
        values += ["[]", "{}", "[[1, 2], 3]", "{'a': }"]
    if not numeric:
        values += ["-1", "nan"]
    if any(isinstance(p, type) and p not in (int, float, bool, str, type(None), Path) for p in parts):
        values += ["no_such_module.Class", "builtins.dict", '{"class_path": "os.getcwd"}']
    return list(dict.fromkeys(values))
