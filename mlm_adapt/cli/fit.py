"""``python -m mlm_adapt fit|validate|test``: the LightningCLI over the model, the data and the export."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import time
from contextvars import ContextVar
from pathlib import Path
from typing import Any, NoReturn

import yaml
from jsonargparse import Namespace
from jsonargparse._actions import print_config_skip  # the flag jsonargparse prints under
from jsonargparse._link_arguments import ActionLink
from jsonargparse._typehints import sub_defaults
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback, DeviceStatsMonitor, LearningRateMonitor, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from typing_extensions import override

from mlm_adapt.cli.usage import ABOUT
from mlm_adapt.data import MLMDataModule
from mlm_adapt.data.forgetting import ForgettingOptions
from mlm_adapt.downstream import DownstreamEvaluation
from mlm_adapt.errors import MLMAdaptError, exception_line
from mlm_adapt.export import HFExport
from mlm_adapt.guard.locks import run_root_locked
from mlm_adapt.model import MaskedLMModule
from mlm_adapt.model.checkpoints import checkpoint_metadata
from mlm_adapt.model.loading import check_trainer_fits
from mlm_adapt.text.segmentation import BUILTIN_NAMES, NOT_A_SEGMENTER
from mlm_adapt.text.traditional import OPENCC_CONFIGS
from mlm_adapt.training import default_callbacks
from mlm_adapt.training.checkpoint_files import attach_csv_logs, resolve_resume, root_loggers
from mlm_adapt.training.resume import (
    FIXED_SETTINGS,
    WEIGHT_SETTINGS,
    check_settings,
    nothing_to_train,
    resume_match,
    run_settings,
)

_GIVEN = re.compile(r"Given value: (.*)")
_LINK_TARGET = re.compile(r"argument ([\w.]+) --> ([\w.]+): ")
_GROUP_VALUE = re.compile(r"""Parser key "([\w.]+)":\s*Unable to load config '([^']*)'""")
# Whether the parser is applying given values (:meth:`MLMAdaptArgumentParser._apply_actions`).
_GIVEN_VALUES: ContextVar[bool] = ContextVar("mlm_adapt_given_values", default=False)
# jsonargparse's reason for a class_path it cannot use, and the class path when the value was a mapping (the
# given value is the path otherwise).
_CLASS_PATH = re.compile(
    r"expects a function or a callable class: (.+?)(?:\.? Got value: Namespace\(class_path='([^']*)'.*)?$",
    re.MULTILINE,
)


def link_target_line(key: str, source: str) -> str:
    """The refusal of a key the parser sets from ``source`` (a link target), given in a config or a flag."""
    return f"{key}: it is set from {source}; give {source} instead"


def group_value_line(key: str, value: Any, example: str) -> str:
    """The refusal of one value where the group of options ``key`` goes, with how to give them."""
    return f"{key}: {value!r} is no value of a group of options; give its options by name: {example}"


def option_error_line(message: str) -> str | None:
    """One line for jsonargparse's union report on ``data.segmentation.segmenter`` or
    ``data.segmentation.opencc`` (else ``None``): which value, why, and what is accepted, instead of the usage
    and a dozen lines about every union member."""
    given = _GIVEN.search(message)
    value = given.group(1).strip() if given else "?"
    link = _LINK_TARGET.match(message)
    if link:  # a link target given as a flag (jsonargparse words it by the value's type)
        return link_target_line(link.group(2), link.group(1))
    group = _GROUP_VALUE.match(message)
    if group:  # a value where a group of options goes: a file jsonargparse could not load
        return group_value_line(group.group(1), group.group(2), f"--{group.group(1)}.NAME VALUE")
    if 'Parser key "data.segmentation.segmenter"' in message:
        names = ", ".join(BUILTIN_NAMES)
        accepted = f"use a built-in name ({names}) or the class_path of a class with segment(texts)"
        not_a_segmenter = NOT_A_SEGMENTER.search(message)
        if not_a_segmenter:
            path = not_a_segmenter.group(1)
            return f"data.segmentation.segmenter: {path} has no segment(texts) method; {accepted}"
        problem = _CLASS_PATH.search(message)
        if problem:
            reason, path = problem.group(1).strip(), problem.group(2) or value
            return f"data.segmentation.segmenter: cannot use class_path {path!r} ({reason}); {accepted}"
        return f"data.segmentation.segmenter: unknown segmenter {value!r}; {accepted}"
    if 'Parser key "data.segmentation.opencc"' in message:
        configs = ", ".join(OPENCC_CONFIGS)
        return (
            f"data.segmentation.opencc: unknown OpenCC configuration {value!r}; use one of {configs} or null"
        )
    return None


# The one-line heading of each group of options, in the order ``--help`` lists them: mlm_adapt's own first,
# Lightning's Trainer last. A group is known by the key of its first option (``""``: the top-level ones).
GROUP_HEADINGS = {
    "": "options",
    "ckpt_path": "the checkpoint to resume (fit) or evaluate (validate, test)",
    "model": "model: the masked LM, its optimizer and learning-rate schedule",
    "data": "data: the corpus, its batches and caches",
    "data.segmentation": "data.segmentation: the words masked as a whole (docs/segmenters.md)",
    "data.masking": "data.masking: what is masked in training and validation",
    "data.blocks": "data.blocks: how documents become blocks and batches",
    "data.replay": "data.replay: general text replayed in training (docs/training.md)",
    "data.streaming": "data.streaming: a training corpus larger than memory or the cache",
    "forgetting": "forgetting: the warning and budget on general text (docs/training.md)",
    "export": "export: the Hugging Face directory written at the end of fit, and the Hub push",
    "downstream": "downstream: labelled tasks scored at step 0 and each validation (docs/downstream.md)",
    "linked": "linked: set from another option (not given on their own)",
    "trainer": "trainer: Lightning's Trainer (devices, precision, steps, logging, callbacks)",
}
CKPT_PATH_HELP = (
    "A checkpoint: a .ckpt file (or FSDP sharded directory) the trainer wrote; ``last``: the run's newest "
    "last.ckpt (a new run when it has none); ``hpc``: the Slurm requeue checkpoint in "
    "trainer.default_root_dir. fit resumes it exactly; validate and test evaluate its weights."
)


SEED_HELP = (
    "The run's one seed: the model's new weights, dropout, the validation split, the order of the "
    "examples, their masks and the replay draws all follow it; true draws one at random"
)


def group_key(group: argparse._ArgumentGroup) -> str | None:
    """The key of ``group`` in :data:`GROUP_HEADINGS` (``None``: nothing shown, e.g. no positionals)."""
    shown = [a.dest for a in group._group_actions if a.help != argparse.SUPPRESS]
    if not shown:
        return None
    if group.title == "Linked arguments":  # jsonargparse's group of link targets
        return "linked"
    if shown[0] in ("help", "config", "print_config", "seed_everything"):
        return ""
    parts = shown[0].split(".")
    nested = ".".join(parts[:2])
    return nested if nested in GROUP_HEADINGS else parts[0] if parts[0] in GROUP_HEADINGS else "trainer"


class MLMAdaptArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, with one-line errors for the union-typed options (:func:`option_error_line`)
    and a help that lists mlm_adapt's own options first, each group under a one-line heading."""

    @override
    def format_help(self) -> str:
        # jsonargparse lists groups as they were added, the Trainer's first and each headed by its class's
        # docstring; a user reads this tool's options first. Only the printing order changes.
        groups, usage = self._action_groups, self.usage
        headings = [(g, g.title, g.description) for g in groups]
        order = list(GROUP_HEADINGS)
        keys = {id(g): group_key(g) for g in groups}
        try:
            self._action_groups = [g for g in groups if keys[id(g)] is not None]
            self._action_groups.sort(key=lambda g: order.index(keys[id(g)]))
            for group in self._action_groups:
                group.title, group.description = GROUP_HEADINGS[keys[id(group)]], None
            self.usage = "%(prog)s [-h] [-c CONFIG] [--print_config[=flags]] [--KEY VALUE ...]"
            return super().format_help()
        finally:
            self._action_groups, self.usage = groups, usage
            for group, title, text in headings:
                group.title, group.description = title, text

    @override
    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        line = option_error_line(message)
        if line is None:
            super().error(message, ex)
        # Raised whatever the parser's exit_on_error, for the CLI's one error boundary.
        raise MLMAdaptError(line)

    @override
    def _apply_actions(self, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        # What a config or flag gives goes through here (a config file, ``fit:`` in a root config, an inline
        # ``--data '{...}'``); jsonargparse drops a link target given so (``data: {forgetting: ...}``) without
        # a word, though it refuses the same key as a flag: refused here, naming the key to give instead. Not
        # while it adds defaults to a parsed config, which holds what the links filled in.
        token = _GIVEN_VALUES.set(not sub_defaults.get())
        try:
            return super()._apply_actions(cfg, *args, **kwargs)
        finally:
            _GIVEN_VALUES.reset(token)

    @override
    def _check_value_key(
        self, action: argparse.Action, value: Any, key: str, *args: Any, **kwargs: Any
    ) -> Any:
        if isinstance(action, ActionLink) and value is not None and _GIVEN_VALUES.get():
            raise MLMAdaptError(link_target_line(key, ", ".join(name for name, _ in action.source)))
        return super()._check_value_key(action, value, key, *args, **kwargs)

    @override
    def _parse_common(self, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        # jsonargparse prints --print_config from inside this method, before the CLI substitutes the
        # loggers' run root: it is put in here first, so the printed config is the one that runs. Only for
        # the printing parse: a nested parse (of a --config file) would fix the root before later flags.
        if hasattr(self, "print_config") and not print_config_skip.get():
            key = self.print_config.get("key")
            section = cfg.get(key) if key else cfg
            trainer = section.get("trainer") if hasattr(section, "get") else None
            if trainer is not None and hasattr(trainer, "logger"):
                root_loggers(trainer)
        return super()._parse_common(cfg, *args, **kwargs)


def process_age() -> float:
    """Seconds since this process started (read from ``/proc`` on Linux; 0 where it is not there)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat, open("/proc/uptime", encoding="ascii") as up:
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
            uptime = float(up.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))


def refuse_group_values(parser: LightningArgumentParser, config: Any) -> None:
    """Refuses, in one line, a group of options given one value in a config (``data: {streaming: true}``,
    the form of a name that is now a group): jsonargparse keeps it and fails building the class."""
    for key, group in parser.groups.items():
        value = config.get(key)
        if not hasattr(group, "instantiate_class") or value is None or isinstance(value, Namespace):
            continue
        names = [
            a.dest.removeprefix(f"{key}.")
            for a in group._group_actions
            if a.dest.startswith(f"{key}.") and a.help != argparse.SUPPRESS and not a.dest.endswith(".help")
        ]
        raise MLMAdaptError(
            group_value_line(key, value, f"{key}: {{{', '.join(f'{n}: ...' for n in names)}}}")
        )


class MLMAdaptCLI(LightningCLI):
    """LightningCLI with the tokenizer and sequence length linked from the model to the data."""

    def __init__(self, *args, **kwargs):
        # The command's wall time counts its imports too (~10 s of a short run on 2 cores).
        self.started = time.monotonic() - process_age()
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("parser_class", MLMAdaptArgumentParser)
        kwargs.setdefault("seed_everything_default", 42)
        # The optimizer comes from model.optimizer, so the no-decay groups and schedule always apply.
        kwargs.setdefault("auto_configure_optimizers", False)
        # Appended to any configured callbacks: exact resume, batch summary, before/after validation.
        kwargs.setdefault("trainer_defaults", {"callbacks": default_callbacks()})
        parser_kwargs = kwargs.get("parser_kwargs", {"prog": "python -m mlm_adapt", "description": ABOUT})
        # Parser errors are raised (ArgumentError), for the CLI's one-line error boundary to report.
        kwargs["parser_kwargs"] = {"exit_on_error": False, **parser_kwargs}
        self.held = contextlib.ExitStack()  # locks held for the whole command
        with self.held:
            super().__init__(MaskedLMModule, MLMDataModule, *args, **kwargs)

    @staticmethod
    @override
    def subcommands() -> dict[str, set[str]]:
        # A masked LM has no prediction loop here: fill-mask is the inference command. Checkpoints are
        # always read weights-only (a pickle could run code): no --weights_only to turn that off.
        return {k: v | {"weights_only"} for k, v in LightningCLI.subcommands().items() if k != "predict"}

    @override
    def _prepare_subcommand_parser(
        self, klass: type, subcommand: str, **kwargs: Any
    ) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        for action in parser._actions:
            if action.dest == "ckpt_path":
                action.help = CKPT_PATH_HELP  # Lightning's names a model registry this tool has no use for
            elif action.dest == "seed_everything":
                action.help = SEED_HELP
            elif action.dest == "trainer.model_registry":
                action.help = argparse.SUPPRESS
        return parser

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("model.model_name_or_path", "data.tokenizer_name_or_path")
        parser.link_arguments("model.max_seq_length", "data.max_seq_length")
        parser.link_arguments("model.new_tokens_file", "data.new_tokens_file")
        # One seed for the run: the data module's split, order, masks and replay draws follow it (true, a
        # random draw, is set after Lightning drew it: before_instantiate_classes).
        parser.link_arguments("seed_everything", "data.seed")
        # Always present (``export:`` in YAML, ``--export.*`` flags); ``export.checkpoint: none``: no export.
        parser.add_lightning_class_args(HFExport, "export")
        # ``forgetting:`` in YAML (``--forgetting.*``): the data module holds it, the callbacks read it there.
        parser.add_class_arguments(ForgettingOptions, "forgetting")
        parser.link_arguments("forgetting", "data.forgetting")
        # jsonargparse gives the link target its own --data.forgetting.help; the group is --forgetting.
        for action in parser._actions:
            if "--data.forgetting.help" in action.option_strings:
                action.help = argparse.SUPPRESS
        # ``downstream:`` in YAML: labelled tasks scored at step 0 and every validation (none by default).
        parser.add_lightning_class_args(DownstreamEvaluation, "downstream")

    @override
    def _parse_ckpt_path(self) -> None:
        """Keeps the command line's settings: Lightning would copy a checkpoint's hyper-parameters over the
        ``model.*`` flags here (for explicit paths only, not ``last``); they are compared instead, the same
        way for every path (:meth:`_check_checkpoint`), and a difference is refused."""

    @override
    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        parser = self._subcommand_parsers[self.subcommand] if self.subcommand else self.parser
        refuse_group_values(parser, config)
        if config.data.seed is True:  # linked before Lightning drew the seed of ``seed_everything: true``
            config.data.seed = config.seed_everything
        # Before the loggers exist: `last` must name the killed run's checkpoint and its logger version;
        # validate/test look it up the same way (and keep a logger version of their own).
        trainer = config.trainer
        accumulate = trainer.get("accumulate_grad_batches")
        if isinstance(accumulate, int) and accumulate < 1:  # Lightning accepts it, then divides by it
            raise MLMAdaptError(f"trainer.accumulate_grad_batches={accumulate} must be at least 1")
        root_loggers(trainer)
        if self.subcommand == "fit":
            if rank_zero_only.rank == 0:  # the other ranks of the run are its own
                self.held.enter_context(run_root_locked(Path(trainer.default_root_dir or ".")))
            resolve_resume(self.config.fit)
        elif self.subcommand in ("validate", "test"):
            resolve_resume(self.config[self.subcommand], follow_version=False)

    def _optimizer_config(self) -> Any:
        """``model.optimizer`` as the config holds it (class path and init args, serialized by the parser)."""
        resolved = yaml.safe_load(self.parser.dump(self.config, skip_none=False))[self.subcommand]
        return resolved["model"]["optimizer"]

    def _check_checkpoint(
        self, settings: tuple[tuple[str, str], ...], optimizer: Any = None
    ) -> dict[str, Any] | None:
        """Refuses a checkpoint whose ``settings`` differ from the command line's (asked of
        :mod:`mlm_adapt.training.resume`; ``optimizer``: :meth:`_optimizer_config`, where ``settings``
        compare it); returns its entries."""
        config = self.config[self.subcommand]
        ckpt_path = config.ckpt_path
        if not ckpt_path or ckpt_path == "hpc":
            return None
        saved = checkpoint_metadata(ckpt_path)  # also refuses a crafted file before Lightning reads it
        current = run_settings(self.model.hparams, self.datamodule.hparams, optimizer, config.seed_everything)
        check_settings(ckpt_path, saved, current, settings)
        return saved

    def _check_device_memory(self, training: bool) -> None:
        """Refuses, before the data is prepared, a model the device cannot hold (single-device and DDP runs:
        sharding strategies hold a share per device)."""
        strategy = self.trainer.strategy
        whole = isinstance(strategy, (SingleDeviceStrategy, DDPStrategy))
        if not whole or isinstance(strategy, DeepSpeedStrategy):
            return
        check_trainer_fits(
            self.model.model,
            self.model.hparams.model_name_or_path,
            "model.model_name_or_path",
            strategy.root_device,
            str(self.trainer.precision),
            training,
        )

    def before_fit(self) -> None:
        """Resuming: refuses changed fixed settings (any checkpoint path, ``last`` or explicit) and a
        non-weights-only load before the data is prepared or anything is written; ``ResumeMatch``, put
        first among the callbacks, compares the rest once the data is set up, and the CSV log is continued
        only when the resume is accepted."""
        self._check_device_memory(training=True)
        optimizer = self._optimizer_config()  # recorded in every checkpoint, for its resume
        saved = self._check_checkpoint(tuple(FIXED_SETTINGS), optimizer)
        if saved is not None:
            trainer = self.trainer
            finished = nothing_to_train(
                self.config.fit.ckpt_path, saved, trainer.max_steps, trainer.max_epochs
            )
            if finished is not None:
                rank_zero_info(f"mlm_adapt fit: {finished}")
                raise SystemExit(0)  # before anything is written: the run's files stay as they are
        match = resume_match(self.trainer.callbacks)
        if match is not None:
            self.trainer.callbacks.remove(match)
            self.trainer.callbacks.insert(0, match)  # its setup first: before any other callback writes
            match.optimizer = optimizer
            match.seed_everything = self.config.fit.seed_everything
            match.expect(self.config.fit.ckpt_path, saved)  # the entries read here, not read again
        if saved is not None:
            attach_csv_logs(self.trainer.loggers)  # writes nothing; keeps Lightning from wiping metrics.csv

    def before_validate(self) -> None:
        """Refuses a checkpoint of another model or vocabulary (one line, not a state-dict traceback)."""
        self._check_device_memory(training=False)
        self._check_checkpoint(WEIGHT_SETTINGS)

    before_test = before_validate

    def after_fit(self) -> None:
        """Prints the wall time of the whole command (rank 0): what a user budgets for the next run."""
        minutes, rest = divmod(round(time.monotonic() - self.started), 60)
        shown = f"{minutes} min {rest} s" if minutes else f"{rest} s"
        if rank_zero_only.rank == 0:
            print(f"mlm_adapt fit: {shown} wall, from start to export", flush=True)

    @override
    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        # The shipped configs list a progress bar and a LearningRateMonitor; --trainer.enable_progress_bar
        # false (what cluster jobs pass) and --trainer.logger false then mean "without them", not a
        # MisconfigurationException.
        trainer_config = self._get(self.config_init, "trainer", default={})
        trainer_config["callbacks"] = without_disabled(
            trainer_config.get("callbacks"),
            progress_bar=trainer_config.get("enable_progress_bar") is not False,
            logger=trainer_config.get("logger") not in (False, []),
        )
        try:
            return super().instantiate_trainer(**kwargs)
        except (ValueError, TypeError) as exc:
            if not _raised_by(exc, LIGHTNING_ARGUMENT_CHECKS):
                raise  # raised elsewhere while the Trainer is built: a bug, whose traceback is the report
            raise MLMAdaptError(f"trainer: {exception_line(exc)}") from None


# The modules in which Lightning checks the Trainer's arguments (FSDP without a GPU, an unknown precision,
# devices=-1 on CPU, ...): a ValueError or TypeError raised by their own code is about a flag the user gave.
LIGHTNING_ARGUMENT_CHECKS = (
    "lightning.pytorch.trainer.trainer",
    "lightning.pytorch.trainer.connectors.accelerator_connector",
    "lightning.fabric.connector",
    "lightning.fabric.accelerators",
    "lightning.pytorch.accelerators",
)


def _raised_by(exc: BaseException, modules: tuple[str, ...]) -> bool:
    """Whether the innermost frame of ``exc``'s traceback is in one of ``modules`` (or their submodules)."""
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    name = frame.tb_frame.f_globals.get("__name__", "") if frame is not None else ""
    return f"{name}.".startswith(tuple(f"{module}." for module in modules))


class DataOnlyCLI(MLMAdaptCLI):
    """Parses a fit config (with ``--data.*``/``--model.*`` overrides) plus a command's own ``options``
    (``(flag, type, default, help)``) and builds only the DataModule."""

    def __init__(self, args: list[str], options: list[tuple[str, Any, Any, str]]) -> None:
        self.options = options
        super().__init__(args=args, run=False, save_config_callback=None)

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        for flag, type_, default, help_ in self.options:
            parser.add_argument(flag, type=type_, default=default, help=help_)

    @override
    def instantiate_classes(self) -> None:
        # The model and trainer are not needed to see the data; loading them would cost time and memory.
        self.datamodule = MLMDataModule(**self.config["data"].as_dict())


def without_disabled(callbacks: Any, progress_bar: bool, logger: bool) -> Any:
    """``callbacks`` without progress bars (``progress_bar`` false) or logging monitors (``logger`` false)."""
    if not isinstance(callbacks, list):
        return callbacks
    dropped: tuple[type[Callback], ...] = ()
    if not progress_bar:
        dropped += (ProgressBar,)
    if not logger:
        dropped += (LearningRateMonitor, DeviceStatsMonitor)
    kept = [c for c in callbacks if not isinstance(c, dropped)]
    names = sorted({type(c).__name__ for c in callbacks if isinstance(c, dropped)})
    if names:
        reasons = [("trainer.enable_progress_bar=false", progress_bar), ("trainer.logger=false", logger)]
        reason = " and ".join(text for text, kept_on in reasons if not kept_on)
        rank_zero_info(f"mlm_adapt: {reason}: leaving out {', '.join(names)} from trainer.callbacks")
    return kept
