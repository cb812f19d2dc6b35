"""What ``fit --ckpt_path last`` resumes: the newest ``last.ckpt`` of the run, and whether it may.

Where the checkpoints are: a ``ModelCheckpoint`` with a ``dirpath`` writes there (a fixed directory);
without one (the shipped configs) Lightning writes to ``<save_dir>/<name>/<version>/checkpoints`` of the
first logger, and a new run gets a new version -- so Lightning's own ``"last"`` lookup, which looks in the
new run's (empty) version, never finds the previous run. :func:`find_last_checkpoint` searches every
version of the run's logger directory and every fixed directory and takes the newest ``last*.ckpt`` by
modification time (Lightning's rule among candidates); the resumed run then logs into that version again.

Settings that a checkpoint fixes (:data:`FIXED_SETTINGS`) are compared with the new command line by
:func:`resume_conflicts`: the weights' architecture and vocabulary, the sequence length, the batch size
(the data loader position counts batches), the word segmentation (segmenter class and init args, OpenCC
conversion) and the training corpus (its fingerprint, when the checkpoint has one). A difference is
refused with one line rather than silently keeping either value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.utilities import rank_zero_info

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.model.checkpoints import callback_state

# Lightning's names for the last checkpoint: last.ckpt, and last-v1.ckpt ... with its version counter.
LAST_NAME = re.compile(r"^last(-v\d+)?\.ckpt$")
CHECKPOINTS_SUBDIR = "checkpoints"

# (section, key): why it cannot change when resuming.
FIXED_SETTINGS: dict[tuple[str, str], str] = {
    ("model", "model_name_or_path"): "the checkpoint's weights belong to that architecture",
    ("model", "max_seq_length"): "the data blocks and the position of the data loader depend on it",
    ("model", "new_tokens_file"): "the vocabulary of the checkpoint's embeddings depends on it",
    ("data", "tokenizer_name_or_path"): "the token ids of the checkpoint depend on it",
    ("data", "batch_size"): "the data loader position is counted in batches",
    ("data", "packing"): "the data blocks and the position of the data loader depend on it",
    ("model", "optimizer"): "the optimizer state restored from the checkpoint (learning rate included) wins",
    # The words (whole-word masking units) of the training blocks: the segmenter's class and init args.
    ("data", "segmenter"): "the words masked as a whole depend on it",
    ("data", "opencc"): "the words masked as a whole depend on it",
    ("data", "hmm"): "the words masked as a whole depend on it",
    ("data", "user_dict"): "the words masked as a whole depend on it",
}
# What ``validate``/``test`` compare: the settings the checkpoint's weights and token ids depend on.
WEIGHT_SETTINGS = (
    ("model", "model_name_or_path"),
    ("model", "new_tokens_file"),
    ("data", "tokenizer_name_or_path"),
)
CORPUS_KEY = "corpus_fingerprint"


def last_checkpoints(directory: str | Path) -> list[Path]:
    """The ``last*.ckpt`` files directly in ``directory``."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return [p for p in directory.iterdir() if LAST_NAME.match(p.name) and p.is_file()]


def find_last_checkpoint(
    version_roots: Iterable[str | Path] = (), fixed_dirs: Iterable[str | Path] = ()
) -> Path | None:
    """The newest ``last*.ckpt`` of a run, or ``None``.

    Args:
        version_roots: Logger directories ``<save_dir>/<name>``; ``*/checkpoints`` under each is searched
            (every version of the run).
        fixed_dirs: ``ModelCheckpoint.dirpath`` directories, searched directly.
    """
    candidates: list[Path] = []
    for root in version_roots:
        root = Path(root)
        if root.is_dir():
            for version in root.iterdir():
                candidates += last_checkpoints(version / CHECKPOINTS_SUBDIR)
    for directory in fixed_dirs:
        candidates += last_checkpoints(directory)
    if not candidates:
        return None
    # Newest write wins; the path breaks ties so the choice does not depend on directory order.
    return max(candidates, key=lambda p: (p.stat().st_mtime_ns, str(p)))


def version_of(checkpoint: str | Path, version_root: str | Path) -> str | None:
    """``version_3`` when ``checkpoint`` is ``<version_root>/version_3/checkpoints/<file>``, else ``None``."""
    checkpoint, root = Path(checkpoint).resolve(), Path(version_root).resolve()
    if checkpoint.parent.name != CHECKPOINTS_SUBDIR or checkpoint.parent.parent.parent != root:
        return None
    return checkpoint.parent.parent.name


def _same(key: str, saved: Any, current: Any) -> bool:
    if saved == current:
        return True
    if isinstance(saved, (list, tuple)) and isinstance(current, (list, tuple)):
        return list(saved) == list(current)  # YAML has no tuples
    if key.endswith(("_path", "_file")) and isinstance(saved, str) and isinstance(current, str):
        # The same local file or directory written differently (./tiny-bert vs tiny-bert).
        old, new = Path(saved).expanduser(), Path(current).expanduser()
        return old.exists() and new.exists() and old.resolve() == new.resolve()
    return False


def _flatten(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(f"{prefix}.{key}", item))
        return flat
    return {prefix: value}


def resume_conflicts(
    saved: Mapping[str, Mapping[str, Any]],
    current: Mapping[str, Mapping[str, Any]],
    settings: Iterable[tuple[str, str]] = tuple(FIXED_SETTINGS),
) -> list[str]:
    """The fixed settings that differ between a checkpoint and the new run, as ``key: saved -> current``.

    Args:
        saved: ``{"model": checkpoint hyper_parameters, "data": datamodule_hyper_parameters, "corpus":
            {"corpus_fingerprint": ...}}`` as stored in the checkpoint (missing sections are not compared:
            a checkpoint of mlm_adapt 0.1 has no corpus fingerprint).
        current: The same sections for the run being started.
        settings: The ``(section, key)`` pairs compared (default: every fixed setting).
    """
    conflicts = []
    for section, key in settings:
        old_section, new_section = saved.get(section), current.get(section)
        if old_section is None or new_section is None or key not in old_section or key not in new_section:
            continue
        old, new = (
            _flatten(f"{section}.{key}", old_section[key]),
            _flatten(f"{section}.{key}", new_section[key]),
        )
        for name in dict.fromkeys([*old, *new]):  # every leaf (optimizer arguments), in order
            if not _same(name, old.get(name), new.get(name)):
                conflicts.append(f"{name}: {old.get(name)!r} -> {new.get(name)!r}")
    old_corpus = (saved.get("corpus") or {}).get(CORPUS_KEY)
    new_corpus = (current.get("corpus") or {}).get(CORPUS_KEY)
    if old_corpus and new_corpus and old_corpus != new_corpus:
        conflicts.append(f"training corpus: fingerprint {old_corpus[:12]} -> {new_corpus[:12]}")
    return conflicts


def checkpoint_settings(checkpoint: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The sections :func:`resume_conflicts` compares, from a checkpoint's entries.

    The optimizer is no hyper-parameter of the module; it comes from the resolved config that the
    ``HFExport`` callback keeps in every checkpoint (absent from checkpoints of runs without LightningCLI).
    """
    config = yaml.safe_load(callback_state(dict(checkpoint), "HFExport").get("config_yaml") or "{}")
    model_config = config.get("model") if isinstance(config, dict) else None
    model = dict(checkpoint.get("hyper_parameters") or {})
    if isinstance(model_config, dict) and "optimizer" in model_config:
        model["optimizer"] = model_config["optimizer"]
    return {"model": model, "data": dict(checkpoint.get("datamodule_hyper_parameters") or {})}


def conflict_message(checkpoint: str | Path, conflicts: list[str]) -> str:
    """The one-line refusal for :func:`resume_conflicts`' findings."""
    return (
        f"ckpt_path: cannot resume {checkpoint} with changed settings ({'; '.join(conflicts)}); they are "
        "fixed by the checkpoint: drop the changed flags to resume, or start a new run from an export "
        "(model.model_name_or_path=EXPORT_DIR) to train with them"
    )


# Loggers that keep a run in <save_dir>/<name>/<version> (where ModelCheckpoint writes without dirpath).
VERSIONED_LOGGERS = ("CSVLogger", "TensorBoardLogger")


# A logger ``save_dir`` that means "the run's root directory", whatever --trainer.default_root_dir says.
RUN_ROOT = "${trainer.default_root_dir}"


def _entries(value: Any) -> list[Any]:
    if value is None or isinstance(value, bool):
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def versioned_logger_args(logger_config: Any) -> list[Any]:
    """``init_args`` of the configured loggers that write versions (CSV, TensorBoard), in order.

    Args:
        logger_config: ``trainer.logger`` as parsed by LightningCLI (a ``class_path``/``init_args``
            namespace, a list of them, ``True``/``False``/``None``).
    """
    found = []
    for entry in _entries(logger_config):
        class_path = str(getattr(entry, "class_path", ""))
        init_args = getattr(entry, "init_args", None)
        if class_path.rsplit(".", 1)[-1] in VERSIONED_LOGGERS and init_args is not None:
            found.append(init_args)
    return found


def root_loggers(trainer_config: Any) -> None:
    """Loggers whose ``save_dir`` is :data:`RUN_ROOT` write under ``trainer.default_root_dir``.

    The shipped configs say ``save_dir: ${trainer.default_root_dir}``, so one ``--trainer.default_root_dir``
    (a Slurm job's ``ROOT``) moves the whole run: logs, the checkpoints in the loggers' versions and the
    export. Only this one value is substituted (the configs are plain YAML, not OmegaConf).

    Args:
        trainer_config: The ``trainer`` section of LightningCLI's parsed config (changed in place).
    """
    root = str(trainer_config.default_root_dir or ".")
    for entry in _entries(trainer_config.logger):
        init_args = getattr(entry, "init_args", None)
        if init_args is not None and init_args.get("save_dir") == RUN_ROOT:
            init_args.save_dir = root


def logger_root(init_args: Any, default_root_dir: str | Path) -> Path:
    """``<save_dir>/<name>``: the directory holding a versioned logger's ``version_N`` directories."""
    save_dir = Path(getattr(init_args, "save_dir", None) or default_root_dir)
    name = getattr(init_args, "name", None)
    return save_dir / name if name else save_dir


def checkpoint_dirs(callbacks_config: Any) -> list[Path]:
    """The ``dirpath`` of every configured ``ModelCheckpoint`` that has one (fixed directories)."""
    dirs = []
    for entry in _entries(callbacks_config):
        if str(getattr(entry, "class_path", "")).endswith("ModelCheckpoint"):
            dirpath = getattr(getattr(entry, "init_args", None), "dirpath", None)
            if dirpath:
                dirs.append(Path(dirpath))
    return dirs


def resolve_resume(config: Any, follow_version: bool = True) -> None:
    """Turns a parsed ``fit`` config's ``ckpt_path`` into the checkpoint to resume, and continues its logs.

    ``last`` becomes the newest ``last*.ckpt`` of the run (see the module docstring), or ``None`` with a
    note when the run has none yet (a first run of a requeue script starts from scratch). When the
    checkpoint lies in a version directory of the first logger, every versioned logger that has that
    version is set to it, so the resumed run writes its logs and checkpoints where the killed run did.
    Other values (a path, ``best``, ``hpc``) are left to Lightning, except for that version.

    Args:
        config: The ``fit`` (``validate``, ``test``) section of LightningCLI's parsed config (changed in
            place).
        follow_version: Set the loggers to the checkpoint's version (``fit``); ``validate`` and ``test``
            only look the checkpoint up, and log into a version of their own.
    """
    ckpt_path = config.ckpt_path
    if not ckpt_path or ckpt_path in ("best", "hpc"):
        return
    trainer = config.trainer
    default_root = Path(trainer.default_root_dir or ".")
    entries = _entries(trainer.logger)
    versioned = versioned_logger_args(trainer.logger)
    first = getattr(entries[0], "init_args", None) if entries else None
    fixed = checkpoint_dirs(trainer.callbacks)
    # Where ModelCheckpoint writes without dirpath: the first logger's version, else the root.
    if trainer.logger is False:
        roots, fixed = [], [*fixed, default_root / CHECKPOINTS_SUBDIR]
    elif not entries:
        roots = [default_root / "lightning_logs"]  # Lightning's default logger
    else:
        roots = [logger_root(first, default_root)] if any(first is v for v in versioned) else []
    if ckpt_path == "last":
        found = find_last_checkpoint(roots, fixed)
        if found is None:
            where = [str(r / "*" / CHECKPOINTS_SUBDIR) for r in roots] + [str(d) for d in fixed]
            if not follow_version:  # validate/test have nothing to evaluate
                raise MLMAdaptError(
                    f"ckpt_path last: no last.ckpt in {', '.join(where)}; give the .ckpt path"
                )
            rank_zero_info(f"mlm_adapt: ckpt_path last: no last.ckpt in {', '.join(where)}; new run")
            config.ckpt_path = None
            return
        config.ckpt_path = str(found)
        rank_zero_info(f"mlm_adapt: ckpt_path last: resuming {found}")
    version = version_of(config.ckpt_path, roots[0]) if roots and versioned and follow_version else None
    if version is None:
        return
    for args in versioned:
        if args is first or (logger_root(args, default_root) / version).is_dir():
            args.version = version
