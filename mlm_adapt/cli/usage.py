"""What ``python -m mlm_adapt`` (no command, ``-h``, ``--help``) prints: one usage line naming every command,
and each command's one-line purpose. Plain text, nothing heavy imported: it answers at once."""

from __future__ import annotations

from mlm_adapt.errors import DEBUG_ENV

ABOUT = "Domain-adaptive whole-word-masking MLM pretraining of Chinese BERT-family models."
# Every command, in the order a run uses them, with its purpose. The trainer commands (LightningCLI's)
# take a fit config; prepare, preview and vocab take the same config and build only the data module.
TRAINER_COMMANDS = {
    "fit": "adapt the model: validation before and after, checkpoints, export of the result",
    "validate": "one evaluation epoch over the validation set(s), e.g. of a checkpoint (--ckpt_path)",
    "test": "one evaluation epoch over the test files (data.test_files)",
}
OTHER_COMMANDS = {
    "prepare": "segment, tokenize and pack the corpus once into --data.prepared_dir",
    "preview": "print training examples exactly as the collator masks them",
    "export": "write a checkpoint as a Hugging Face directory (and push it to the Hub)",
    "fill-mask": "the top-k tokens per [MASK] and whole-word fillings of mask runs",
    "vocab": "report [UNK] characters and candidate terms the word segmenter splits",
    "plot": "draw loss/accuracy/perplexity curves of a run's metrics.csv",
}
SUMMARIES = {**TRAINER_COMMANDS, **OTHER_COMMANDS}
PROG = "python -m mlm_adapt"


def usage_line() -> str:
    """``usage: python -m mlm_adapt [--debug] {fit,validate,...} ...``: every command, in one line."""
    return f"usage: {PROG} [--debug] {{{','.join(SUMMARIES)}}} ..."


def usage() -> str:
    """The top-level help: the usage line, what the tool does, each command with its purpose."""
    width = max(map(len, SUMMARIES)) + 2
    trainer = "\n".join(f"  {name:<{width}}{text}" for name, text in TRAINER_COMMANDS.items())
    other = "\n".join(f"  {name:<{width}}{text}" for name, text in OTHER_COMMANDS.items())
    trainer_commands = "{" + ",".join(TRAINER_COMMANDS) + "}"
    return (
        f"{usage_line()}\n\n{ABOUT}\n\n"
        f"trainer commands {trainer_commands} (LightningCLI: -c/--config FILE, --model.*, --data.*, "
        f"--trainer.*):\n{trainer}\n\n"
        f"other commands (prepare, preview and vocab take the same config):\n{other}\n\n"
        f"{PROG} COMMAND --help lists a command's options. Errors are one line; add --debug (or set "
        f"{DEBUG_ENV}=1) for the traceback.\n"
    )


def description() -> str:
    """The description of the trainer commands' LightningCLI parser (``fit --help`` and friends)."""
    others = "; ".join(f"{name}: {text}" for name, text in OTHER_COMMANDS.items())
    return (
        f"{ABOUT} Trainer commands below; also {others} ({PROG} COMMAND --help). Errors are one "
        f"line; add --debug (or set {DEBUG_ENV}=1) for the traceback."
    )


def given_flags(args: list[str], names: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(name, value)`` of every ``NAME VALUE`` or ``NAME=VALUE`` of ``names`` on a command line, read before
    any parser (one without its value is left to the parser to refuse)."""
    found = []
    for i, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        if name in names and (equals or i + 1 < len(args)):
            found.append((name, value if equals else args[i + 1]))
    return found
