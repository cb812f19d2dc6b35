"""Resuming a run: which checkpoint ``--ckpt_path last`` means and whether it may be resumed, atomic
checkpoint files, a random stream that resumes exactly, and a CSV log that continues.

Without a ``ModelCheckpoint.dirpath`` (the shipped configs) Lightning writes checkpoints to
``<save_dir>/<name>/<version>/checkpoints`` of the first logger, and a new run gets a new version, so
Lightning's own ``"last"`` lookup (in the new, empty version) never finds the previous run:
:func:`find_last_checkpoint` searches every version and every fixed directory instead. Settings a checkpoint
fixes (:data:`FIXED_SETTINGS`) and its corpus are compared with the new run by :func:`resume_conflicts`;
a difference is refused with one line rather than silently keeping either value.

Exact mid-epoch resume: torchdata's ``StatefulDataLoader`` restores the data position (its ``state_dict``
rides in checkpoints), the masks are a pure hash of ``(seed, epoch, example_id)``
(``mlm_adapt.masking.collator``), and :class:`ExactResume` reseeds dropout per batch.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.data import _set_sampler_epoch
from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from typing_extensions import override

from mlm_adapt.data.loader_state import convert_loader_state, corpus_fingerprint
from mlm_adapt.data.samplers import EpochSampler, LengthGroupedEpochSampler
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.loads import load_weights_only
from mlm_adapt.guard.outputs import Output, write_file
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
WORLD_KEY = "world_size"  # ranks (devices x nodes) that wrote the checkpoint


def find_last_checkpoint(
    version_roots: Iterable[str | Path] = (), fixed_dirs: Iterable[str | Path] = ()
) -> Path | None:
    """The newest ``last*.ckpt`` (by modification time, Lightning's rule) in ``*/checkpoints`` of the logger
    directories ``<save_dir>/<name>`` (every version of the run) and in ``ModelCheckpoint.dirpath``s."""
    found = [p for root in version_roots for p in Path(root).glob(f"*/{CHECKPOINTS_SUBDIR}/last*.ckpt")]
    found += [p for directory in fixed_dirs for p in Path(directory).glob("last*.ckpt")]
    candidates = [p for p in found if LAST_NAME.match(p.name) and p.is_file()]
    # Newest write wins; the path breaks ties so the choice does not depend on directory order.
    return max(candidates, key=lambda p: (p.stat().st_mtime_ns, str(p)), default=None)


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
    if not isinstance(value, Mapping):
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, item in value.items():
        flat |= _flatten(f"{prefix}.{key}", item)
    return flat


def resume_conflicts(
    saved: Mapping[str, Mapping[str, Any]],
    current: Mapping[str, Mapping[str, Any]],
    settings: Iterable[tuple[str, str]] = tuple(FIXED_SETTINGS),
) -> list[str]:
    """The ``settings`` (``(section, key)`` pairs) that differ between a checkpoint and the new run, as
    ``key: saved -> current``. Both are ``{"model": hyper-parameters, "data": datamodule hyper-parameters,
    "corpus": {"corpus_fingerprint": ...}}``; a section one side lacks is not compared (old checkpoints)."""
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
    """The sections :func:`resume_conflicts` compares, from a checkpoint's entries. The optimizer is no
    hyper-parameter of the module: it comes from the config ``HFExport`` keeps in checkpoints of the CLI."""
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
    """``init_args`` of the loggers of ``trainer.logger`` (as LightningCLI parsed it) that write versions."""
    found = []
    for entry in _entries(logger_config):
        class_path = str(getattr(entry, "class_path", ""))
        init_args = getattr(entry, "init_args", None)
        if class_path.rsplit(".", 1)[-1] in VERSIONED_LOGGERS and init_args is not None:
            found.append(init_args)
    return found


def root_loggers(trainer_config: Any) -> None:
    """Loggers whose ``save_dir`` is :data:`RUN_ROOT` write under ``trainer.default_root_dir``, so one
    ``--trainer.default_root_dir`` (a Slurm job's ``ROOT``) moves the whole run. Only this one value is
    substituted (the configs are plain YAML, not OmegaConf); ``trainer_config`` is changed in place."""
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

    ``last`` becomes the newest ``last*.ckpt`` of the run, or ``None`` with a note when the run has none
    yet (a first run of a requeue script). When the checkpoint lies in a version directory of the first
    logger, every versioned logger that has that version is set to it, so the resumed run writes where the
    killed run did. Other values (a path, ``best``, ``hpc``) are left to Lightning.

    Args:
        config: The ``fit`` (``validate``, ``test``) section of LightningCLI's parsed config (changed).
        follow_version: Set the loggers to the checkpoint's version (``fit``; not ``validate``/``test``).
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


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoint IO with atomic local writes (:func:`~mlm_adapt.guard.outputs.write_file`) and weights-only
    local reads (:func:`~mlm_adapt.guard.loads.load_weights_only`).

    Lightning stages a local write in the system temp directory; when that is another filesystem
    (node-local ``/tmp``, checkpoints on NFS/Lustre) the move degrades to a copy over the target, and a kill
    during it leaves ``last.ckpt`` truncated. Here the file is staged next to the target, fsynced and
    renamed over it; a symlinked name (``save_last: link``) is replaced, not written through. Remote URLs
    keep Lightning's behaviour: object-store uploads are already all-or-nothing.
    """

    @override
    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> Any:
        if not isinstance(get_filesystem(path), LocalFileSystem):
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        if map_location is None:
            map_location = lambda storage, loc: storage  # noqa: E731 -- Lightning's default: keep devices
        return load_weights_only(path, key="ckpt_path", map_location=map_location)

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        with (
            write_file(Output(path, key="checkpoint", directory=False, follow_link=False)) as staged,
            # A Python file: a full disk is then an OSError (ENOSPC), not torch's "unexpected pos".
            open(staged, "wb") as handle,
        ):
            torch.save(checkpoint, handle)


class _ContinuingWriter(ExperimentWriter):
    """Lightning's CSV writer without the deletion of an existing ``metrics.csv``; appends to it."""

    @override
    def _check_log_dir_exists(self) -> None:
        pass


def read_rows(metrics_csv: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The header and the rows of a CSV log."""
    with open(metrics_csv, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def _step(row: dict[str, str]) -> int:
    try:
        return int(float(row.get("step") or 0))
    except ValueError:
        return 0  # rows without a step are kept


def _csv_logs(loggers: list[Logger]) -> list[tuple[CSVLogger, Path]]:
    if rank_zero_only.rank != 0:  # the CSV logger writes on rank 0 only
        return []
    found = [
        (logger, Path(logger.log_dir) / "metrics.csv") for logger in loggers if isinstance(logger, CSVLogger)
    ]
    return [(logger, metrics_csv) for logger, metrics_csv in found if metrics_csv.is_file()]


def attach_csv_logs(loggers: list[Logger]) -> list[Path]:
    """Makes every ``CSVLogger`` with a ``metrics.csv`` append to it instead of deleting it (which Lightning
    does when it opens a version directory); writes nothing. Call before the trainer opens its loggers; a
    refused resume then leaves the file untouched (:class:`ResumeCheck` drops the rows past the checkpoint
    once the resume is accepted). Returns the attached files."""
    found = _csv_logs(loggers)
    for logger, metrics_csv in found:
        writer = _ContinuingWriter(log_dir=logger.log_dir)
        writer.metrics_keys = read_rows(metrics_csv)[0]
        logger._experiment = writer  # the property returns it instead of opening (and wiping) the file
    return [metrics_csv for _, metrics_csv in found]


def drop_rows_after(loggers: list[Logger], step: int) -> None:
    """Removes the rows logged after ``step`` (the checkpoint's last logger step) from every ``CSVLogger``'s
    ``metrics.csv``, atomically; other loggers are left alone (TensorBoard appends)."""
    for _, metrics_csv in _csv_logs(loggers):
        header, rows = read_rows(metrics_csv)
        kept = [row for row in rows if _step(row) <= step]
        if len(kept) == len(rows):
            continue
        with (
            write_file(Output(metrics_csv, key="trainer.logger", directory=False)) as staged,
            open(staged, "w", newline="", encoding="utf-8") as handle,
        ):
            writer = csv.DictWriter(handle, fieldnames=header)
            writer.writeheader()
            writer.writerows(kept)


def batch_seed(seed: int, epoch: int, batch_idx: int, rank: int) -> int:
    """A 63-bit seed for one training batch on one rank (stable across processes and Python versions)."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{batch_idx}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def check_corpus(saved_state: dict[str, Any], fingerprint: str | None, checkpoint: str) -> None:
    """Refuses a resume whose training corpus differs from the checkpoint's (``ExactResume``'s state)."""
    conflicts = resume_conflicts({"corpus": saved_state}, {"corpus": {CORPUS_KEY: fingerprint}})
    if conflicts:
        raise MLMAdaptError(conflict_message(checkpoint, conflicts))


class ResumeCheck(L.Callback):
    """The corpus half of the resume check, then the CSV log is continued. The CLI puts it first among the
    callbacks, so a refused resume stops before any other callback's ``setup`` writes (config, export).

    Args:
        saved_state: ``ExactResume``'s state in the checkpoint (its corpus fingerprint).
        log_step: The last logger step the checkpoint covers.
        checkpoint: The checkpoint's path, for the refusal.
    """

    def __init__(self, saved_state: dict[str, Any], log_step: int, checkpoint: str):
        self.saved_state = dict(saved_state)
        self.log_step = log_step
        self.checkpoint = checkpoint

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        datamodule = getattr(trainer, "datamodule", None)
        fingerprint = corpus_fingerprint(datamodule) if datamodule is not None else None
        check_corpus(self.saved_state, fingerprint, self.checkpoint)
        drop_rows_after(trainer.loggers, self.log_step)  # accepted: nothing was written before this


def continue_on_other_world(
    trainer: L.Trainer, epoch: int, batches_drawn: int, saved_world_size: int
) -> None:
    """Continues the checkpoint's epoch, written by ``saved_world_size`` ranks that had each drawn
    ``batches_drawn`` batches of it, on this trainer's ranks, at the same place of the epoch's global
    example order (:meth:`EpochSampler.resume_at`), and says in one line what changes.

    Every rank draws the epoch's global order in turn, so the examples seen so far are the first
    ``batches_drawn x batch size x saved ranks`` of it, whatever the number of ranks; the resumed run takes
    the rest in order, in global batches of its own size. Lightning's count of the epoch's batches is moved
    to the same place, so the epoch ends where the order does.
    """
    world_size = trainer.world_size
    loaders = trainer.fit_loop._combined_loader.flattened
    batch_size = int(getattr(loaders[0], "batch_size", None) or 1)
    consumed = batches_drawn * batch_size * saved_world_size
    samplers = [getattr(loader, "sampler", None) for loader in loaders]
    exact = all(isinstance(s, EpochSampler) for s in samplers)
    for sampler in samplers:
        if isinstance(sampler, EpochSampler):
            sampler.resume_at(epoch, consumed)
    progress = trainer.fit_loop.epoch_loop.batch_progress.current
    shift = consumed // (batch_size * world_size) - progress.ready
    for counter in ("ready", "started", "processed", "completed"):
        setattr(progress, counter, max(0, getattr(progress, counter) + shift))
    grouped = any(isinstance(s, LengthGroupedEpochSampler) for s in samplers)
    order = (
        "data.group_by_length groups the order by the number of ranks, so the remaining examples come in "
        "another order"
        if grouped
        else f"the epoch's example order continues at example {consumed}"
        if exact
        else "the loader is not mlm_adapt's sampler: its order restarts"
    )
    rank_zero_info(
        f"mlm_adapt: resuming on {world_size} rank(s) instead of the checkpoint's {saved_world_size}: "
        f"a global batch is {batch_size * world_size} examples instead of {batch_size * saved_world_size} "
        f"(data.batch_size {batch_size} x ranks); {order}"
    )


class ExactResume(L.Callback):
    """Makes ``fit --ckpt_path last`` (or a SLURM requeue) continue exactly where the killed run was.

    Before every training batch, torch's generators (CPU and CUDA) are reseeded from
    ``(seed, epoch, batch_idx, global_rank)``: dropout then depends only on the batch position, which the
    checkpoint restores, not on the random numbers the process drew before (validation loaders, a fresh
    dataloader iterator), and differs across ranks. It installs :class:`AtomicCheckpointIO` over
    Lightning's default and keeps the corpus fingerprint in checkpoints: another corpus (the loader
    position would point into other data) is refused when ``trainer.fit(ckpt_path=...)`` restores it.

    Args:
        seed: Base seed; default: the ``seed_everything`` value (``PL_GLOBAL_SEED``), else 0.
    """

    def __init__(self, seed: int | None = None):
        self.seed = seed
        self.corpus_fingerprint: str | None = None
        self.world_size = 1
        self._saved_world_size: int | None = None
        self._streaming = False
        self._loader_states: list[dict[str, Any]] = []
        self._loader_epoch = 0

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.seed is None:
            self.seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        self.world_size = int(getattr(trainer, "world_size", 1))
        datamodule = getattr(trainer, "datamodule", None)
        if stage == "fit" and datamodule is not None:  # set up before the callbacks: its data is ready
            self.corpus_fingerprint = corpus_fingerprint(datamodule)
            self._streaming = getattr(datamodule, "train_stream", None) is not None

    @override
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {WORLD_KEY: self.world_size}
        if self.corpus_fingerprint:
            state[CORPUS_KEY] = self.corpus_fingerprint
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Called when fit restores a checkpoint, after setup: the current corpus is known.
        check_corpus(state_dict, self.corpus_fingerprint, "the checkpoint")
        saved = state_dict.get(WORLD_KEY)  # absent from checkpoints of older versions: taken as unchanged
        valid = isinstance(saved, int) and not isinstance(saved, bool) and saved > 0
        self._saved_world_size = saved if valid else None
        if self._streaming and self._saved_world_size not in (None, self.world_size):
            raise MLMAdaptError(
                f"trainer.devices: the checkpoint was written by {self._saved_world_size} ranks and a "
                f"streamed corpus's position is held per rank; resume on {self._saved_world_size} ranks "
                f"(trainer.devices x trainer.num_nodes), not {self.world_size}"
            )

    @override
    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        fit_loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
        self._loader_states = list((fit_loop.get("state_dict") or {}).get("combined_loader") or [])
        current = (fit_loop.get("epoch_progress") or {}).get("current") or {}
        self._loader_epoch = int(current.get("processed", 0))

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Puts the train loader at the checkpoint's position, in the checkpoint's epoch, before its first
        batch is drawn.

        Lightning loads the loader's saved position only when it builds the loader after the restore. A
        ``configure_optimizers`` that reads ``trainer.estimated_stepping_batches`` under a finite
        ``max_epochs`` (the linear schedule under ``configs/domain.yaml``) builds it before, and the resumed
        run then restarts the epoch's order (a different batch at the first resumed step). Its iterator was
        also made before the sampler learned the restored epoch, so workers that prefetched at the start
        drew from epoch 0's order. Either way the position is loaded here again, after the epoch is set,
        and a new iterator is made from it."""
        states, self._loader_states = self._loader_states, []
        fit_loop = trainer.fit_loop
        loaders, fetcher = fit_loop._combined_loader, fit_loop._data_fetcher
        if not states or loaders is None or fetcher is None:
            return
        epoch = fit_loop.epoch_progress.current.processed
        for loader in loaders.flattened:
            _set_sampler_epoch(loader, epoch)
        # Saved at the last batch of an epoch, the position is that epoch's end: the restored run starts
        # the next epoch (Lightning counted it finished), from its first batch.
        in_saved_epoch = epoch == self._loader_epoch
        if self._saved_world_size not in (None, trainer.world_size):
            drawn = [convert_loader_state(state, 0).get("_num_yielded", 0) for state in states]
            continue_on_other_world(
                trainer, epoch, int(drawn[0]) if in_saved_epoch else 0, self._saved_world_size
            )
        elif in_saved_epoch:
            loaders._load_state_dicts(states)
        fit_loop._combined_loader_states_to_load = []  # loaded: Lightning must not load it a second time
        iter(fetcher)

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        torch.manual_seed(batch_seed(self.seed, trainer.current_epoch, batch_idx, trainer.global_rank))
