"""What a checkpoint must match for a run to resume from it: the one place that decides, and says every
mismatch in one line.

A resume continues the checkpoint's run (its weights, optimizer state, data position and replay
controller), so it is refused when the new run differs in what those depend on:

- the settings a checkpoint fixes (:data:`FIXED_SETTINGS`, the optimizer's included; ``validate``/``test``
  compare :data:`WEIGHT_SETTINGS`), a difference refused rather than silently keeping either value;
- the training corpus, by its fingerprint (:func:`~mlm_adapt.data.loader_state.corpus_fingerprint`): the
  loader position would point into other data;
- the number of ranks, for a streamed corpus only: its position is held per rank (a map-style corpus
  continues its global example order on any number, :mod:`mlm_adapt.training.exact_resume`).

The checkpoint's side is :class:`ResumeMatch`'s own saved state (:data:`RECORD_KEYS`), trusted as
the tool wrote it once the checkpoint format is this version's
(:func:`~mlm_adapt.model.module.check_checkpoint_format`).
The CLI asks twice: :func:`check_settings` before the data is prepared (a changed flag is refused in seconds,
not after preprocessing), and :class:`ResumeMatch` with the whole record once the data is set up, before any
other callback's ``setup`` writes and before anything is restored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import lightning as L
from typing_extensions import override

from mlm_adapt.data.loader_state import corpus_fingerprint
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.secrets import secret_setting
from mlm_adapt.model.checkpoints import callback_state
from mlm_adapt.options import option_value
from mlm_adapt.training.checkpoint_files import drop_rows_after

# (section, key): why it cannot change when resuming; a dotted key names an option of a group.
FIXED_SETTINGS: dict[tuple[str, str], str] = {
    ("model", "model_name_or_path"): "the checkpoint's weights belong to that architecture",
    ("model", "max_seq_length"): "the data blocks and the position of the data loader depend on it",
    ("model", "new_tokens_file"): "the vocabulary of the checkpoint's embeddings depends on it",
    ("data", "tokenizer_name_or_path"): "the token ids of the checkpoint depend on it",
    ("data", "batch_size"): "the data loader position is counted in batches",
    ("data", "blocks.packing"): "the data blocks and the position of the data loader depend on it",
    ("model", "optimizer"): "the optimizer state restored from the checkpoint (learning rate included) wins",
    ("model", "head_warmup_steps"): "the steps that train the head alone, and the baseline's, depend on it",
    # The words (whole-word masking units) of the training blocks: the segmenter's class and init args.
    ("data", "segmentation.segmenter"): "the words masked as a whole depend on it",
    ("data", "segmentation.opencc"): "the words masked as a whole depend on it",
    ("data", "segmentation.hmm"): "the words masked as a whole depend on it",
    ("data", "segmentation.user_dict"): "the words masked as a whole depend on it",
    # Which examples are drawn, in which order, and how they are masked.
    ("data", "blocks.group_by_length"): "the order the examples are drawn in depends on it",
    ("data", "streaming.enabled"): "the data loader position depends on it",
    ("data", "streaming.shuffle_buffer_size"): "the order a streamed corpus is drawn in depends on it",
    ("data", "masking.scheme"): "the masks of the examples depend on it",
    ("data", "masking.mlm_probability"): "the masks of the examples depend on it",
    ("data", "masking.mask_replace_prob"): "the masks of the examples depend on it",
    ("data", "masking.random_replace_prob"): "the masks of the examples depend on it",
    ("data", "masking.eval_mlm_probability"): "the validation masks (so the baseline it holds) depend on it",
    # The run's one seed (the data module's is linked from it). Compared as a number: `true` draws one.
    ("run", "seed_everything"): "the order the examples are drawn in and their masks depend on it",
}
# What ``validate``/``test`` compare: the settings the checkpoint's weights and token ids depend on.
WEIGHT_SETTINGS = (
    ("model", "model_name_or_path"),
    ("model", "new_tokens_file"),
    ("data", "tokenizer_name_or_path"),
)
SETTINGS_KEY = "settings"
CORPUS_KEY = "corpus_fingerprint"
WORLD_KEY = "world_size"  # ranks (devices x nodes) that wrote the checkpoint
RECORD_KEYS = (SETTINGS_KEY, CORPUS_KEY, WORLD_KEY)
_MISSING = object()


def run_settings(
    model_hparams: Mapping[str, Any],
    data_hparams: Mapping[str, Any],
    optimizer: Any = None,
    seed_everything: Any = None,
) -> dict[str, dict[str, Any]]:
    """A run's :data:`FIXED_SETTINGS` as ``{"model": {...}, "data": {...}, "run": {...}}`` (plain values, as
    checkpoints keep them): the module's and the data module's hyper-parameters, ``optimizer`` (its class
    path and init args as the CLI's config holds them) and ``seed_everything`` (the config's; recorded when
    it is a number). ``None``: not known, not compared."""
    sections: dict[str, Mapping[str, Any]] = {"model": model_hparams, "data": data_hparams}
    settings: dict[str, dict[str, Any]] = {"model": {}, "data": {}, "run": {}}
    for section, key in FIXED_SETTINGS:
        if (section, key) == ("model", "optimizer"):
            if optimizer is not None:
                settings["model"][key] = optimizer
        elif section == "run":
            if isinstance(seed_everything, int) and not isinstance(seed_everything, bool):
                settings["run"][key] = seed_everything
        elif (value := option_value(sections[section], key, _MISSING)) is not _MISSING:
            settings[section][key] = value
    return settings


def saved_record(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint records of its run: ``{"settings": sections, "corpus_fingerprint", "world_size"}``
    (``None`` where the run had none: no corpus fingerprint, no ResumeMatch among its callbacks)."""
    record = callback_state(checkpoint, ResumeMatch.__name__)
    return {
        SETTINGS_KEY: record.get(SETTINGS_KEY, {}),
        CORPUS_KEY: record.get(CORPUS_KEY),
        WORLD_KEY: record.get(WORLD_KEY),
    }


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
    """The ``settings`` (``(section, key)`` pairs) and the corpus that differ between a checkpoint and the
    new run, as ``key: saved -> current``. Both are ``{"model": {...}, "data": {...}, "corpus":
    {"corpus_fingerprint": ...}}``; what one side lacks is not compared (an optimizer given from Python)."""
    conflicts = []
    for section, key in settings:
        old_section, new_section = saved.get(section), current.get(section)
        if old_section is None or new_section is None or key not in old_section or key not in new_section:
            continue
        option = key if section == "run" else f"{section}.{key}"  # seed_everything: a top-level option
        old, new = _flatten(option, old_section[key]), _flatten(option, new_section[key])
        for name in dict.fromkeys([*old, *new]):  # every leaf (optimizer arguments), in order
            if secret_setting(name):  # a rotated key changes no word, weight or batch
                continue
            if not _same(name, old.get(name), new.get(name)):
                conflicts.append(f"{name}: {old.get(name)!r} -> {new.get(name)!r}")
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


def check_settings(
    checkpoint_path: str | Path,
    checkpoint: Mapping[str, Any],
    current: Mapping[str, Mapping[str, Any]],
    settings: Iterable[tuple[str, str]] = tuple(FIXED_SETTINGS),
) -> None:
    """Refuses, in one line naming each difference, a checkpoint whose ``settings`` differ from
    ``current`` (:func:`run_settings` of the new run)."""
    conflicts = resume_conflicts(saved_record(checkpoint)[SETTINGS_KEY], current, settings)
    if conflicts:
        raise MLMAdaptError(conflict_message(checkpoint_path, conflicts))


class ResumeMatch(L.Callback):
    """Keeps in every checkpoint what a resume must match (the fixed settings, the corpus fingerprint,
    the number of ranks) and refuses a resume from one that does not match, in one line.

    The CLI puts it first among the callbacks and names the checkpoint (:meth:`expect`): the comparison
    then runs in ``setup``, once the data is set up and before any other callback's ``setup`` writes
    (config, export), and a refused resume leaves the run directory as it was. Otherwise (``Trainer.fit``
    given a ``ckpt_path`` in Python, Lightning's ``hpc`` checkpoint) it runs when the checkpoint is
    restored, before the optimizer and loop states are.

    Args:
        optimizer: The optimizer's class path and init args, as the config holds them (``None``: not
            recorded, not compared).
        seed_everything: The config's ``seed_everything`` (compared when a number).
    """

    def __init__(self, optimizer: Any = None, seed_everything: Any = None):
        self.optimizer = optimizer
        self.seed_everything = seed_everything
        self.settings: dict[str, dict[str, Any]] = {}
        self.corpus_fingerprint: str | None = None
        self.world_size = 1
        self.streaming = False
        self._expected: tuple[str, Mapping[str, Any]] | None = None
        self._checked = False

    def expect(self, checkpoint_path: str | Path | None, checkpoint: Mapping[str, Any] | None) -> None:
        """Names the checkpoint the coming ``fit`` resumes from and its entries
        (:func:`~mlm_adapt.model.checkpoints.checkpoint_metadata`), so it is compared in ``setup``;
        ``checkpoint`` ``None``: a new run."""
        self._expected = (str(checkpoint_path), checkpoint) if checkpoint is not None else None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.world_size = int(getattr(trainer, "world_size", 1))
        datamodule = getattr(trainer, "datamodule", None)
        model_hparams = dict(getattr(pl_module, "hparams", None) or {})
        data_hparams = dict(getattr(datamodule, "hparams", None) or {})
        self.settings = run_settings(model_hparams, data_hparams, self.optimizer, self.seed_everything)
        if datamodule is not None:  # set up before the callbacks: its data is ready
            self.corpus_fingerprint = corpus_fingerprint(datamodule)
            self.streaming = getattr(datamodule, "train_stream", None) is not None
        self._checked = False
        if self._expected is not None:
            (checkpoint_path, checkpoint), self._expected = self._expected, None  # held no longer than this
            self.check(checkpoint, checkpoint_path)
            drop_rows_after(trainer.loggers, _last_log_step(checkpoint))

    @override
    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._checked or trainer.state.fn != "fit":
            return
        self.check(checkpoint, str(trainer.ckpt_path or "the checkpoint"))
        drop_rows_after(trainer.loggers, _last_log_step(checkpoint))

    def check(self, checkpoint: Mapping[str, Any], checkpoint_path: str = "the checkpoint") -> None:
        """Refuses ``checkpoint`` in one line when it does not match this run (see the module's text)."""
        record = saved_record(checkpoint)
        saved = {**record[SETTINGS_KEY], "corpus": {CORPUS_KEY: record[CORPUS_KEY]}}
        current = {**self.settings, "corpus": {CORPUS_KEY: self.corpus_fingerprint}}
        conflicts = resume_conflicts(saved, current)
        if conflicts:
            raise MLMAdaptError(conflict_message(checkpoint_path, conflicts))
        saved_world = record[WORLD_KEY]
        if self.streaming and saved_world not in (None, self.world_size):
            raise MLMAdaptError(
                f"trainer.devices: the checkpoint was written by {saved_world} ranks and a "
                f"streamed corpus's position is held per rank; resume on {saved_world} ranks "
                f"(trainer.devices x trainer.num_nodes), not {self.world_size}"
            )
        self._checked = True

    @override
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {SETTINGS_KEY: self.settings, WORLD_KEY: self.world_size}
        if self.corpus_fingerprint:
            state[CORPUS_KEY] = self.corpus_fingerprint
        return state


def epochs_trained(checkpoint: Mapping[str, Any]) -> int:
    """The epochs whose every batch a checkpoint has trained (its loop state; 0 if it has none)."""
    fit_loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
    epochs = (fit_loop.get("epoch_progress") or {}).get("current") or {}
    processed, started = int(epochs.get("processed", 0)), int(epochs.get("started", 0))
    # Saved in its epoch (mlm_adapt's checkpoints always are): the epoch counts once its last batch trained.
    last_batch = (fit_loop.get("epoch_loop.batch_progress") or {}).get("is_last_batch", False)
    return processed + int(bool(last_batch) and processed < started)


def nothing_to_train(
    checkpoint_path: str | Path, checkpoint: Mapping[str, Any], max_steps: int, max_epochs: int | None
) -> str | None:
    """The line that says a resume would train nothing, the checkpoint having reached the trainer's
    ``max_steps`` (or ``max_epochs``, as the Trainer resolved it; -1 or ``None``: no limit), else ``None``.
    Lightning would restore it, train nothing and the export would then be written again with an earlier
    validation's metrics as the run's result."""
    step = int(checkpoint.get("global_step", 0))
    epochs = epochs_trained(checkpoint)
    if max_steps != -1 and step >= max_steps:
        trained = f"{step} steps, reaching trainer.max_steps {max_steps}"
    elif max_epochs is not None and max_epochs != -1 and epochs >= max_epochs:
        trained = f"{epochs} epochs ({step} steps), reaching trainer.max_epochs {max_epochs}"
    else:
        return None
    return (
        f"ckpt_path: {checkpoint_path} already trained {trained}: nothing to train, the export is left as "
        "it is; to train longer, raise --trainer.max_steps (or --trainer.max_epochs) above it"
    )


def _last_log_step(checkpoint: Mapping[str, Any]) -> int:
    # Lightning logs the rows of optimizer step k at logger step k - 1.
    return checkpoint.get("global_step", 0) - 1


def resume_match(callbacks: Iterable[Any]) -> ResumeMatch | None:
    """The :class:`ResumeMatch` among ``callbacks`` (a trainer's), if any."""
    return next((c for c in callbacks if isinstance(c, ResumeMatch)), None)
