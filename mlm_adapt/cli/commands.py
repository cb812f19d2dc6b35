"""``python -m mlm_adapt COMMAND``: the registry of commands (dispatch and ``--help``), ``export``, and the
one error boundary: a user error (parser, :class:`MLMAdaptError`, Lightning misconfiguration) is one
``mlm_adapt: error: ...`` line and status 2 (``--debug`` keeps the traceback); a stop signal (Ctrl-C,
SIGTERM, SIGUSR1) is one line naming the command and what was kept, and ``128 + signal``.

The command is read first and only what it uses is imported: this module and every command's module import
nothing heavy at the top; a command imports torch, Lightning or transformers when it runs (the trainer
commands to build LightningCLI's parser), so ``--help`` and a refused option answer at once.
"""

from __future__ import annotations

import contextlib
import inspect
import locale
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import NamedTuple

import yaml
from jsonargparse import ArgumentParser

from mlm_adapt.cli.data_only import check_corpus_files, prepare_main, preview_main, vocab_main
from mlm_adapt.cli.fill_mask import fill_mask_main
from mlm_adapt.cli.help_cache import cacheable, cached_help
from mlm_adapt.cli.plot import plot_main
from mlm_adapt.cli.usage import (
    OTHER_COMMANDS,
    PROG,
    SUMMARIES,
    TRAINER_COMMANDS,
    description,
    given_flags,
    usage,
)
from mlm_adapt.errors import (
    DEBUG_ENV,
    DEBUG_HINT,
    STOP,
    MLMAdaptError,
    check_checkpoint_path,
    debug_enabled,
    install_stop_handlers,
    parser_message,
    stop_now,
    user_message,
)
from mlm_adapt.export.options import ExportOptions


@dataclass(kw_only=True, eq=False)
class ExportCommand(ExportOptions):
    """Writes a checkpoint of fit as a Hugging Face directory: safetensors weights, the tokenizer,
    training_config.yaml and a README.md model card with the before/after validation metrics; the directory is
    reloaded with AutoModelForMaskedLM/AutoTokenizer and its logits compared with the checkpoint's.

    Args:
        ckpt_path: Checkpoint file (.ckpt: single device, DDP, FSDP full) or FSDP sharded directory.
        output_dir: Directory to write; must be empty or absent, or an earlier export with --overwrite.
        base_model: Base model directory or Hub name, if the one recorded in the checkpoint is not available
            here (its config and tokenizer are used; the weights come from the checkpoint).
        progress_bar: Show progress bars; false (batch jobs) logs one line per phase with its duration.
        data_config: The fit config of the run (a file): with --merge_budget or --merge_alpha, the merge is
            chosen and scored on its validation sets (data.validation_files, the second the general one)
            and trainer.limit_val_batches of each, as at the end of fit.
    """

    ckpt_path: str
    output_dir: str
    base_model: str | None = None
    progress_bar: bool = True
    data_config: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.data_config is not None and not self.merges:
            raise MLMAdaptError(
                "--data_config is read only to merge (--merge_budget or --merge_alpha); drop it, or add one"
            )


def bare_flags(args: list[str], options: type) -> list[str]:
    """Lets boolean options be given as bare flags, as documented (``--overwrite`` -> ``--overwrite=true``):
    jsonargparse expects a value after a boolean option."""
    names = {
        f"--{n}" for n, p in inspect.signature(options).parameters.items() if p.annotation in (bool, "bool")
    }
    out = []
    for i, arg in enumerate(args):
        value_follows = i + 1 < len(args) and args[i + 1].lower() in ("true", "false")
        out.append(f"{arg}=true" if arg in names and not value_follows else arg)
    return out


def export_main(args: list[str]) -> None:
    """Parses the options, exports, and prints the files, the reload check and the before/after table."""
    parser = ArgumentParser(
        prog=f"{PROG} export",
        description=ExportCommand.__doc__.split("\n")[0],
        exit_on_error=False,
    )
    parser.add_class_arguments(ExportCommand)
    command = ExportCommand(**parser.parse_args(bare_flags(args, ExportCommand)).as_dict())
    check_checkpoint_path(command.ckpt_path, "--ckpt_path")
    # The options are valid: now the export's stack (torch, Lightning, transformers).
    import transformers  # noqa: PLC0415 - imported by the command that uses it (module docstring)

    from mlm_adapt.data.progress import Progress  # noqa: PLC0415
    from mlm_adapt.export.callback import export_checkpoint  # noqa: PLC0415
    from mlm_adapt.model.metrics import metrics_table  # noqa: PLC0415

    transformers.logging.disable_progress_bar()
    progress = Progress("export", bars=command.progress_bar)
    datamodule, limit = None, None
    if command.data_config is not None and command.merges:
        data_args = ["--config", command.data_config]
        check_corpus_files("export", data_args)
        from mlm_adapt.cli.fit import DataOnlyCLI  # noqa: PLC0415 - the data module's stack

        data_cli = DataOnlyCLI(data_args, [])
        datamodule, limit = data_cli.datamodule, data_cli.config.trainer.limit_val_batches
    result = export_checkpoint(
        command.ckpt_path, command.output_dir, command, command.base_model, progress, datamodule, limit
    )
    output_dir = Path(command.output_dir)
    files = sorted(p.name for p in output_dir.iterdir() if not p.name.startswith("."))
    print(f"wrote {output_dir}: {', '.join(files)}")
    print(
        "reload check: AutoModelForMaskedLM logits match the checkpoint "
        f"(max |difference| {result.logit_difference:.2e})"
    )
    info, step, merged = result.info, result.info.final_metrics_step, result.merge
    if merged is not None:
        print(f"mlm_adapt merge: {merged.describe()}")
        if table := merged.table():
            print(table)
    columns = (merged.merged_metrics or None, f"merged α={merged.alpha:.4g}") if merged is not None else ()
    print(
        metrics_table(info.baseline_metrics, info.final_metrics, *columns)
        + (f"\n(after: step {step})" if step else "")
    )
    if merged is not None and not merged.merged_metrics:
        print(
            f"merged toward the base model at α={merged.alpha:.4g}: not scored here (no --data_config); "
            f"`python -m mlm_adapt validate --config RUN_CONFIG --model.model_name_or_path {output_dir}` "
            "scores it"
        )
    if result.hub_url:
        print(f"pushed to {result.hub_url}")


class Command(NamedTuple):
    """A command besides LightningCLI's own (fit, validate, test)."""

    run: Callable[[list[str]], object]
    summary: str


_RUNS: dict[str, Callable[[list[str]], object]] = {
    "prepare": prepare_main,
    "preview": preview_main,
    "export": export_main,
    "fill-mask": fill_mask_main,
    "vocab": vocab_main,
    "plot": plot_main,
}
COMMANDS: dict[str, Command] = {name: Command(_RUNS[name], text) for name, text in OTHER_COMMANDS.items()}


@contextmanager
def stop_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGUSR1 end any command with one line and ``128 + signal``: during training
    SIGTERM/SIGUSR1 first checkpoint (:mod:`mlm_adapt.training.signals`); SIGINT raises ``KeyboardInterrupt``,
    so that Lightning's graceful shutdown and every ``finally`` (staging directories, locks) still run."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    install_stop_handlers()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _interrupt)
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    STOP.signum = STOP.signum or signum
    raise KeyboardInterrupt


def _child_signals() -> None:
    """A forked worker drops the command's stop handlers: Ctrl-C reaches the whole process group, the workers
    ignore it and the command ends its pool, with SIGTERM, which must kill them at once (a handler raising
    in a worker holding its pool's queue lock would hang the pool's shutdown, and the command)."""
    if signal.getsignal(signal.SIGINT) is _interrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        if signal.getsignal(signum) is stop_now:
            signal.signal(signum, signal.SIG_DFL)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_child_signals)


def _stopped(command: str) -> None:
    print(f"mlm_adapt: error: {STOP.summary(command)}", file=sys.stderr)
    sys.exit(STOP.exit_code)


def _run(entry: Callable[[list[str]], object], args: list[str], usage: str) -> None:
    # No signal recorded, whatever an earlier command in this process (from Python, in tests) received.
    STOP.reset()
    command = usage or "mlm_adapt"
    with stop_signals():
        try:
            if debug_enabled():
                entry(args)  # every exception with its traceback
            else:
                _report_user_errors(entry, args, usage)
        except KeyboardInterrupt:  # Ctrl-C
            STOP.signum = STOP.signum or signal.SIGINT
            _stopped(command)
        except (SystemExit, Exception):
            if STOP.signum is None:
                raise  # --help, an exit already reported, or a bug
            # Stopped: whatever else happened on the way out (datasets' pool failing to wait on its workers).
            _stopped(command)
        if STOP.signum is not None:  # a signal during the export after training, say
            _stopped(command)


def _report_user_errors(entry: Callable[[list[str]], object], args: list[str], usage: str) -> None:
    try:
        check_config_files(args, usage)
        entry(args)
    except Exception as exc:
        if STOP.signum is not None:
            raise  # stopped by a signal: reported as the stop (see _run), whatever failed on the way out
        translated = user_message(exc)
        if translated is None:
            raise  # not the user's doing: the traceback is the bug report
        message, code = translated
        if parser_message(exc) is not None:
            hint = f" ({help_command(usage)} for usage)"
        elif isinstance(exc, MLMAdaptError):
            hint = ""
        else:
            hint = f" ({DEBUG_HINT})"
        print(f"mlm_adapt: error: {message}{hint}", file=sys.stderr)
        sys.exit(code)


def _fit_cli(args: list[str]) -> None:
    # LightningCLI's parser needs the Trainer's, the model's and the data module's signatures: the whole
    # training stack, imported here, for these commands only (their bare --help: cli.help_cache).
    from mlm_adapt.cli.fit import MLMAdaptCLI  # noqa: PLC0415 - imported by the command that uses it

    # LightningCLI reads sys.argv itself; passing it again only triggers its "args and argv" warning.
    MLMAdaptCLI(
        args=None if args == sys.argv[1:] else args,
        parser_kwargs={"prog": PROG, "description": description()},
    )


def _trainer_command(args: list[str]) -> None:
    if cacheable(args, TRAINER_COMMANDS):  # the help, once built, without building the parser again
        cached_help(args[0], lambda: _fit_cli(args))
    _fit_cli(args)


def help_command(usage: str) -> str:
    """``python -m mlm_adapt [COMMAND] --help``, where a parser error points (``usage``: the command)."""
    return " ".join([PROG, *usage.split(), "--help"])


def check_config_files(args: list[str], usage: str) -> None:
    """Refuses a ``--config``/``-c`` of the command ``usage`` that is neither a UTF-8 file nor a YAML
    mapping, before its parser (for the trainer commands, the training stack) is built, with the line that
    parser would print."""
    for _, value in given_flags(args, ("--config", "-c")):
        if os.path.isfile(value):
            try:
                Path(value).read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise MLMAdaptError(f"--config: {value} is not UTF-8 text; give a YAML file") from None
            continue
        if os.path.exists(value):
            continue
        try:
            inline = yaml.safe_load(value)
        except yaml.YAMLError:
            inline = None
        if not isinstance(inline, dict):  # a YAML mapping is a config given inline
            raise MLMAdaptError(
                f'Parser key "config": File does not exist: {value!r} ({help_command(usage)} for usage)'
            )


def _unknown_command(args: list[str]) -> None:
    choices = ", ".join(repr(name) for name in SUMMARIES)
    raise MLMAdaptError(f"invalid choice: {args[0]!r} (choose from {choices}) ({PROG} --help for usage)")


def silence_third_party_noise() -> None:
    """Ignores, by exact message, third-party notices a user cannot act on (as pyproject.toml's pytest
    filterwarnings does); every other warning is shown. Ranks and workers run it too."""
    # torchdata's StatefulDataLoader calls torch.set_vital, which torch deprecated.
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
    # Lightning's own use of torch.utils._pytree (lightning/pytorch/utilities/_pytree.py).
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # Lightning's advertising ("💡 Tip: ... try installing litlogger"), logged at every Trainer's start.
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_no_tips)


def _no_tips(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("💡")


def read_files_as_utf8() -> None:
    """Files opened without an encoding (a ``--config`` read by jsonargparse, any library's text file) are
    read as UTF-8 whatever the locale: configs and corpora are UTF-8, a ``zh_CN.GBK`` or ``C`` locale is not.

    ``open`` takes its default encoding from ``LC_CTYPE`` when it is called (outside Python's UTF-8 mode),
    so setting ``LC_CTYPE`` here covers every later open; the terminal's output encoding is left as it is.
    """
    if sys.flags.utf8_mode or locale.getpreferredencoding(False).lower().replace("-", "") == "utf8":
        return
    for name in ("C.UTF-8", "en_US.UTF-8"):
        with contextlib.suppress(locale.Error):
            locale.setlocale(locale.LC_CTYPE, name)
            return


def main(args: list[str] | None = None) -> None:
    """Entry point of ``python -m mlm_adapt`` and the ``mlm-adapt`` script."""
    silence_third_party_noise()
    read_files_as_utf8()
    from_argv = args is None
    args = list(sys.argv[1:] if args is None else args)
    if "--debug" in args:
        # An environment variable, so that DDP ranks and DataLoader workers started from here see it too.
        os.environ[DEBUG_ENV] = "1"
        args = [a for a in args if a != "--debug"]
        if from_argv:
            sys.argv[1:] = args  # LightningCLI parses sys.argv itself (see _fit_cli)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), end="")  # every command with its purpose, without importing any of them
        sys.exit(0)
    if args[0] in COMMANDS:
        if from_argv:
            # The command gets its arguments explicitly; the LightningCLI-based ones (preview, vocab) would
            # otherwise warn that sys.argv holds arguments as well.
            sys.argv[1:] = []
        _run(COMMANDS[args[0]].run, args[1:], usage=args[0])
    elif args[0] in TRAINER_COMMANDS or args[0].startswith("-"):
        # A trainer command, or LightningCLI's own options before one (-c CONFIG fit, --print_config).
        _run(_trainer_command, args, usage=args[0] if args[0] in TRAINER_COMMANDS else "")
    else:
        _run(_unknown_command, args, usage="")
