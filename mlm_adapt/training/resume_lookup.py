"""What ``fit --ckpt_path last`` resumes: the newest ``last.ckpt`` of the run, and whether it may.

Where the checkpoints are: a ``ModelCheckpoint`` with a ``dirpath`` writes there (a fixed directory);
without one (the shipped configs) Lightning writes to ``<save_dir>/<name>/<version>/checkpoints`` of the
first logger, and a new run gets a new version -- so Lightning's own ``"last"`` lookup, which looks in the
new run's (empty) version, never finds the previous run. :func:`find_last_checkpoint` searches every
version of the run's logger directory and every fixed directory and takes the newest ``last*.ckpt`` by
modification time (Lightning's rule among candidates); the resumed run then logs into that version again.

Settings that a checkpoint fixes (:data:`FIXED_SETTINGS`) are compared with the new command line by
:func:`resume_conflicts`: the weights' architecture and vocabulary, the sequence length, the batch size
(the data loader position counts batches) and the training corpus (its fingerprint, when the checkpoint
has one). A difference is refused with one line rather than silently keeping either value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

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
}
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
    if key.endswith(("_path", "_file")) and isinstance(saved, str) and isinstance(current, str):
        # The same local file or directory written differently (./tiny-bert vs tiny-bert).
        old, new = Path(saved).expanduser(), Path(current).expanduser()
        return old.exists() and new.exists() and old.resolve() == new.resolve()
    return False


def resume_conflicts(
    saved: Mapping[str, Mapping[str, Any]], current: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """The fixed settings that differ between a checkpoint and the new run, as ``key: saved -> current``.

    Args:
        saved: ``{"model": checkpoint hyper_parameters, "data": datamodule_hyper_parameters, "corpus":
            {"corpus_fingerprint": ...}}`` as stored in the checkpoint (missing sections are not compared:
            a checkpoint of mlm_adapt 0.1 has no corpus fingerprint).
        current: The same sections for the run being started.
    """
    conflicts = []
    for (section, key), _reason in FIXED_SETTINGS.items():
        old_section, new_section = saved.get(section), current.get(section)
        if old_section is None or new_section is None or key not in old_section or key not in new_section:
            continue
        if not _same(key, old_section[key], new_section[key]):
            conflicts.append(f"{section}.{key}: {old_section[key]!r} -> {new_section[key]!r}")
    old_corpus = (saved.get("corpus") or {}).get(CORPUS_KEY)
    new_corpus = (current.get("corpus") or {}).get(CORPUS_KEY)
    if old_corpus and new_corpus and old_corpus != new_corpus:
        conflicts.append(f"training corpus: fingerprint {old_corpus[:12]} -> {new_corpus[:12]}")
    return conflicts


def conflict_message(checkpoint: str | Path, conflicts: list[str]) -> str:
    """The one-line refusal for :func:`resume_conflicts`' findings."""
    return (
        f"ckpt_path: cannot resume {checkpoint} with changed settings ({'; '.join(conflicts)}); they are "
        "fixed by the checkpoint: drop the changed flags to resume, or start a new run from an export "
        "(model.model_name_or_path=EXPORT_DIR) to train with them"
    )


# Loggers that keep a run in <save_dir>/<name>/<version> (where ModelCheckpoint writes without dirpath).
VERSIONED_LOGGERS = ("CSVLogger", "TensorBoardLogger")


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
