"""The LightningDataModule: corpus -> jieba words -> tokens with word ids -> blocks -> whole-word masks."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import datasets
import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, Dataset
from transformers import PreTrainedTokenizerBase
from typing_extensions import override

from mlm_adapt.data.corpus_statistics import corpus_stats, describe_stats, refuse_unmaskable, split_counts
from mlm_adapt.data.forgetting import ForgettingOptions
from mlm_adapt.data.loader_state import WorkerCountFreeLoader
from mlm_adapt.data.prepared import load_prepared
from mlm_adapt.data.preprocess import BLOCK_FEATURES, AnyDataset, drop_empty, to_blocks
from mlm_adapt.data.replay import (
    IDLE_REPLAY,
    Replay,
    ReplayOptions,
    replay_settings,
    replay_summary,
    resume_line,
)
from mlm_adapt.data.samplers import KeyedDataset, train_sampler
from mlm_adapt.data.streaming import StreamingCorpus, StreamingOptions, open_stream
from mlm_adapt.data.validation_sets import ValidationFiles, ValidationSets, held_out_error, warn_overlap
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.guard.locks import locked
from mlm_adapt.masking import MaskingScheme, WholeWordMaskCollator
from mlm_adapt.masking.options import MaskingOptions
from mlm_adapt.masking.schedule import ScheduledRates, Stepping, trainer_stepping
from mlm_adapt.options import as_options, plain
from mlm_adapt.text.blocks import BlockOptions
from mlm_adapt.text.corpus import load_files, load_hub
from mlm_adapt.text.files import expand_files
from mlm_adapt.text.segmentation import Segmentation, SegmentationOptions, segmenter_setting
from mlm_adapt.text.tokenizer import load_tokenizer

# The seed of the data when no run seed is given (the CLI's seed_everything default too).
DEFAULT_SEED = 42
# The lock that lets one process of a job fill a shared ``datasets`` cache (``.preprocessing.lock`` in it).
PREPROCESS_LOCK = "preprocessing"


def check_arguments(
    hp: Any,
    blocks: BlockOptions,
    masking: MaskingOptions,
    replay: ReplayOptions,
    streaming: StreamingOptions,
    forgetting: ForgettingOptions,
) -> ValidationSets:
    """Refuses, in one line naming the key, what torch or datasets would reject only after preprocessing
    (or never), before any data is read, and what the groups (each checked on its own) cannot do together;
    returns the validation sets."""
    if blocks.document_attention and streaming.enabled:
        raise MLMAdaptError(
            "data.blocks.document_attention is not available with data.streaming.enabled; set one of them "
            "to false"
        )
    if not masking.schedule.constant and streaming.enabled:
        # A stream has no loader positions to derive steps from (workers split files, not batches).
        raise MLMAdaptError(
            "data.masking.mlm_probability: a masking-rate schedule needs a map-style corpus; "
            "set data.streaming.enabled: false or use one rate"
        )
    if not hp.train_files and not hp.dataset_name and not hp.prepared_dir:
        raise MLMAdaptError("data.train_files is empty; give text files or globs (or data.dataset_name)")
    if not 0.0 <= hp.validation_split < 1.0:
        raise MLMAdaptError(f"data.validation_split={hp.validation_split} must be in [0, 1), e.g. 0.05")
    if hp.max_seq_length < 8:
        raise MLMAdaptError(
            # In a fit config the value comes from model.max_seq_length (linked here): name that key.
            f"model.max_seq_length={hp.max_seq_length} is too short (data.max_seq_length when the "
            "datamodule is used alone); use at least 8 (e.g. 512)"
        )
    least = {"batch_size": 1, "eval_batch_size": 1, "num_workers": 0, "preprocessing_num_workers": 1}
    for key, bound in least.items():
        if hp[key] is not None and hp[key] < bound:
            raise MLMAdaptError(f"data.{key}={hp[key]} must be at least {bound}")
    if hp.prepared_dir and streaming.enabled:
        raise MLMAdaptError(
            "data.prepared_dir: prepared blocks are not streamed; set data.streaming.enabled false"
        )
    if replay.files and streaming.enabled:
        raise MLMAdaptError(
            "data.replay.files: replay is not available with data.streaming.enabled; mix the files beforehand"
        )
    sets = ValidationSets(hp.validation_files)
    if forgetting.budget is None:
        return sets
    # A forgetting budget the run could not hold: no general text, no general set.
    if not replay.files:
        raise MLMAdaptError(
            "forgetting.budget needs general text to replay: set data.replay.files (general-domain files)"
        )
    if len(sets.names) < 2:
        raise MLMAdaptError(
            "forgetting.budget needs a general validation set to measure forgetting on: give "
            "data.validation_files as a mapping, e.g. {domain: null, general: [general_val.txt]}"
        )
    general = sets.names[1]
    if sets.files[general] is None:
        raise MLMAdaptError(
            f"forgetting.budget: the general validation set {sets.key(general)} is null, held out of the "
            "training corpus: domain text, on which no forgetting shows; give it general-domain files, e.g. "
            "{domain: null, general: [general_val.txt]}"
        )
    if not replay.schedule.constant:
        raise MLMAdaptError(
            "data.replay.rate: with forgetting.budget it is the starting rate, one number (e.g. 0.1)"
        )
    if replay.schedule.initial_rate > forgetting.max_replay_rate:
        raise MLMAdaptError(
            f"data.replay.rate={replay.schedule.initial_rate} exceeds forgetting.max_replay_rate="
            f"{forgetting.max_replay_rate}; lower the one or raise the other"
        )
    return sets


class MLMDataModule(L.LightningDataModule):
    """Chinese corpora for whole-word-masking MLM: loading, segmentation, tokenization, packing, masking.

    Args:
        train_files: Training files or globs: ``.txt`` (one document per line), ``.jsonl``/``.json``,
            ``.csv`` or ``.parquet`` (text in ``text_column``).
        validation_files: Validation files or globs (default: ``validation_split`` of the training documents).
            A mapping ``{name: files}`` gives several sets: the first logs ``val/*`` (checkpoint monitors),
            the others ``val_<name>/*``; ``null`` files mean the held-out split.
        validation_split: Seeded fraction of training documents held out for validation when no
            ``validation_files`` are given (and the Hub dataset has no ``validation`` split).
        test_files: Files for ``test``; the validation data is used when absent.
        dataset_name: A dataset for ``datasets.load_dataset`` (Hub name or local dir) instead of files.
        dataset_config: Its configuration name.
        text_column: Column holding the text in json/csv/parquet files and datasets.
        tokenizer_name_or_path: Tokenizer to use; linked from ``model.model_name_or_path`` by the CLI.
        max_seq_length: Block length in tokens, ``[CLS]``/``[SEP]`` included; linked from the model.
        new_tokens_file: Tokens added to the tokenizer (one per line); linked from ``model.new_tokens_file``.
        segmentation: How the text is cut into words (:class:`SegmentationOptions`).
        masking: What is masked (:class:`MaskingOptions`).
        blocks: How documents become blocks and batches (:class:`BlockOptions`).
        replay: General text replayed in training (:class:`ReplayOptions`).
        streaming: Streaming the training corpus (:class:`StreamingOptions`).
        batch_size: Training examples per batch and device.
        eval_batch_size: Validation/test batch size (default: ``batch_size``).
        num_workers: DataLoader worker processes.
        preprocessing_num_workers: Forked processes segmenting, tokenizing and packing (same blocks for any).
        seed: Seed of the validation split, the order, the masks and the replay draws; the CLI sets it to
            ``seed_everything`` (the one seed of a run; the number Lightning drew for ``true``).
        cache_dir: Where ``datasets`` caches loaded and preprocessed data (default: its own cache).
        prepared_dir: Written by ``python -m mlm_adapt prepare``: its blocks are memory-mapped, no raw file
            is read. Settings differing from its manifest are refused.
        forgetting: The forgetting warning, budget and checks (:class:`ForgettingOptions`); in a fit
            config the ``forgetting:`` group (``--forgetting.*``), linked here.
    """

    def __init__(
        self,
        train_files: list[str] | None = None,
        validation_files: ValidationFiles = None,
        validation_split: float = 0.05,
        test_files: list[str] | None = None,
        dataset_name: str | None = None,
        dataset_config: str | None = None,
        text_column: str = "text",
        tokenizer_name_or_path: str = "hfl/chinese-bert-wwm-ext",
        max_seq_length: int = 512,
        new_tokens_file: str | None = None,
        segmentation: SegmentationOptions = SegmentationOptions(),
        masking: MaskingOptions = MaskingOptions(),
        blocks: BlockOptions = BlockOptions(),
        replay: ReplayOptions = ReplayOptions(),
        streaming: StreamingOptions = StreamingOptions(),
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 2,
        preprocessing_num_workers: int | None = None,
        seed: int | bool = DEFAULT_SEED,
        cache_dir: str | None = None,
        prepared_dir: str | None = None,
        forgetting: ForgettingOptions | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        # The groups, checked; a caller may give each as its mapping. Checkpoints and the loggers'
        # hparams.yaml keep plain values: the CLI's config values, else the groups' (a Python caller's).
        self.segmentation = as_options(SegmentationOptions, segmentation, "data.segmentation")
        self.masking = as_options(MaskingOptions, masking, "data.masking")
        self.blocks = as_options(BlockOptions, blocks, "data.blocks")
        self.replay = as_options(ReplayOptions, replay, "data.replay")
        self.streaming = as_options(StreamingOptions, streaming, "data.streaming")
        self.forgetting = as_options(ForgettingOptions, forgetting, "forgetting")
        # The CLI links seed_everything here; ``false`` (no seeding) reaches here as a bool: the default.
        self.seed = DEFAULT_SEED if isinstance(seed, bool) else seed
        groups = {
            "segmentation": self.segmentation,
            "masking": self.masking,
            "blocks": self.blocks,
            "replay": self.replay,
            "streaming": self.streaming,
            "forgetting": self.forgetting,
        }
        for name, group in groups.items():
            given = self.hparams[name]
            # Every option of the group: a caller's mapping may name only some.
            recorded = {**plain(group), **given} if isinstance(given, Mapping) else plain(group)
            self.hparams[name] = self._hparams_initial[name] = recorded
        self.validation_sets = check_arguments(
            self.hparams, self.blocks, self.masking, self.replay, self.streaming, self.forgetting
        )
        # Names of the validation sets, the primary one (logged as ``val/*``) first.
        self.validation_set_names = self.validation_sets.names
        # The setting is the config value, which LightningCLI keeps as the hyperparameter (the argument it
        # passes holds jsonargparse's unbuilt factory); Segmentation builds the segmenter from it per process.
        seg = self.segmentation
        setting = segmenter_setting(self.hparams["segmentation"]["segmenter"])
        self.segmenter = Segmentation(setting, seg.hmm, seg.user_dict, seg.opencc)
        self.train_dataset: datasets.Dataset | None = None
        self.train_stream: StreamingCorpus | None = None
        self.val_dataset: datasets.Dataset | None = None
        self.val_datasets: dict[str, datasets.Dataset] = {}  # every set by name, ``val_dataset`` first
        self.test_dataset: datasets.Dataset | None = None
        self.replayer: Replay | None = None  # general blocks and the replay rate, with data.replay.files
        self._replay_state: dict | None = None  # a checkpoint's, until setup builds ``replay``
        # ``[first_step, replay settings]`` of each stretch of the run (a resume may change them).
        self.replay_segments: list[list[Any]] = [[0, replay_settings(self.replay, self.forgetting)]]
        self.corpus_stats: dict[str, int] = {}

    @cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer (loaded on first use)."""
        name = self.hparams.tokenizer_name_or_path
        tokenizer = load_tokenizer(name, self.hparams.new_tokens_file)
        if tokenizer.mask_token_id is None:
            raise MLMAdaptError(
                f"model.model_name_or_path: tokenizer of {name!r} has no mask token; "
                "use a masked-LM (BERT-family) checkpoint"
            )
        return tokenizer

    @cached_property
    def collator(self) -> WholeWordMaskCollator:
        """Validation and test masks: whole words at ``eval_mlm_probability``, fixed whatever the training."""
        return self._collator("whole_word", self.masking.eval_mlm_probability)

    @cached_property
    def train_collator(self) -> WholeWordMaskCollator:
        """The training collator: ``data.masking.scheme`` units at the schedule's rate (the sampler attaches
        each batch's rate when the schedule is not constant); the validation collator when it is the same."""
        rate, scheme = self.masking.schedule.initial_rate, self.masking.scheme
        if scheme == "whole_word" and rate == self.collator.mlm_probability:
            return self.collator
        return self._collator(scheme, rate)

    def _collator(self, scheme: MaskingScheme, rate: float) -> WholeWordMaskCollator:
        return WholeWordMaskCollator(
            self.tokenizer,
            mlm_probability=rate,
            mask_replace_prob=self.masking.mask_replace_prob,
            random_replace_prob=self.masking.random_replace_prob,
            seed=self.seed,
            scheme=scheme,
            # Unpacked blocks hold one document each: nothing to separate.
            document_attention=self.blocks.document_attention and self.blocks.packing,
        )

    def _read_files(
        self, key: str, files: list[str] | None = None, cache_dir: str | None = None
    ) -> datasets.Dataset:
        """The documents of ``files`` (default: ``data.<key>``), empty lines dropped; errors name ``key``."""
        hp = self.hparams
        name = key if files is not None else f"data.{key}"
        paths = expand_files(files if files is not None else hp[key], name)
        return drop_empty(load_files(paths, name, hp.text_column, cache_dir or hp.cache_dir), name)

    def _read_eval_files(
        self, cache_dir: str | None = None
    ) -> tuple[dict[str, datasets.Dataset], str | None]:
        """The validation sets and test data given as files, and the split of the held-out set (if any)."""
        sets = self.validation_sets
        splits = {
            sets.splits[n]: self._read_files(sets.key(n), f, cache_dir) for n, f in sets.files.items() if f
        }
        if self.hparams.test_files:
            splits["test"] = self._read_files("test_files", cache_dir=cache_dir)
        return splits, sets.held_out_split

    def train_documents(self, cache_dir: str | None = None) -> datasets.Dataset:
        """The training corpus (files or Hub dataset) with empty lines dropped, before any split."""
        if self.hparams.dataset_name:
            return self._read_hub("train", cache_dir)
        return self._read_files("train_files", cache_dir=cache_dir)

    def _read_hub(self, split: str, cache_dir: str | None) -> datasets.Dataset:
        hp = self.hparams
        documents = load_hub(
            hp.dataset_name, hp.dataset_config, split, hp.text_column, cache_dir or hp.cache_dir
        )
        return drop_empty(documents, split)

    def documents(self, cache_dir: str | None = None) -> datasets.DatasetDict:
        """The first step of every map-style path (``fit``, ``prepare``): the corpus' documents by split.

        ``train``, the validation sets (files, a Hub ``validation`` split, or the seeded held-out part of the
        training documents), ``test`` and ``mix`` (the general text for replay), empty lines dropped.
        ``cache_dir`` replaces ``data.cache_dir`` (``prepare`` points it into its staging directory).
        """
        hp = self.hparams
        splits = {"train": self.train_documents(cache_dir)}
        files, held_out = self._read_eval_files(cache_dir)
        if hp.dataset_name and held_out:
            with contextlib.suppress(MLMAdaptError):  # no validation split: hold one out below
                splits[held_out], held_out = self._read_hub("validation", cache_dir), None
        splits.update(files)
        if self.replay.files:  # general text for replay: blocks of its own, drawn at sampling time
            splits["mix"] = self._read_files("data.replay.files", self.replay.files, cache_dir)
        for split in splits:
            if len(splits[split]) == 0:
                key = self.validation_sets.split_key(split)
                raise MLMAdaptError(
                    f"{key}: no text left after dropping empty lines; check the files' content"
                )
        if held_out:
            if hp.validation_split <= 0 or len(splits["train"]) < 2:
                raise held_out_error(hp.validation_split, len(splits["train"]))
            parts = splits["train"].train_test_split(test_size=hp.validation_split, seed=self.seed)
            splits["train"], splits[held_out] = parts["train"], parts["test"]
        return datasets.DatasetDict(splits)

    def make_blocks(self, documents: AnyDataset, features: datasets.Features = BLOCK_FEATURES) -> AnyDataset:
        """The second step: every split (or a stream) segmented, tokenized with word ids and packed into
        blocks (:func:`~mlm_adapt.data.preprocess.to_blocks`)."""
        hp = self.hparams
        return to_blocks(
            documents,
            self.tokenizer,
            self.segmenter,
            hp.max_seq_length,
            self.blocks.packing,
            document_delimiters=self.blocks.document_attention,
            features=features,
            num_proc=hp.preprocessing_num_workers,
        )

    @override
    def prepare_data(self) -> None:
        # Runs on local rank 0 of every node before setup: fills datasets' fingerprint cache, which setup()
        # then reads. On several nodes sharing one cache (a shared filesystem) the first node to take the
        # cache's lock preprocesses; the others wait, then find every step cached and only load it. With
        # node-local caches each node preprocesses its own.
        if self.hparams.prepared_dir:
            return  # segmented and tokenized by ``prepare``: nothing to do on any node
        self.segmenter("预热")  # builds jieba's dictionary cache once per node; ranks and workers load it
        if self.streaming.enabled:
            return
        cache = Path(self.cache_dir or datasets.config.HF_DATASETS_CACHE).absolute()
        cache.mkdir(parents=True, exist_ok=True)
        with locked(cache / PREPROCESS_LOCK, "data.cache_dir", f"the preprocessing in {cache}", wait=True):
            self.make_blocks(self.documents())

    @override
    def setup(self, stage: str | None = None) -> None:
        if self.train_dataset is not None or self.train_stream is not None:
            return
        if self.streaming.enabled:
            self._setup_streaming()
            return
        if self.hparams.prepared_dir:
            self._setup_prepared()
            return
        raw = self.documents()
        warn_overlap(raw, self.validation_sets, self.hparams.train_files, self.replay.files)
        blocks = self.make_blocks(raw)
        self._check_maskable(blocks["train"])
        self.train_dataset = blocks["train"]
        self._set_eval_datasets(blocks)
        # Tokens and characters are summed for train only: the statistics name no other split's.
        counts = {split: {"documents": len(raw[split]), "blocks": len(blocks[split])} for split in blocks}
        counts["train"] = split_counts(raw["train"], blocks["train"])
        self.corpus_stats = corpus_stats(counts, self.validation_sets.splits)
        rank_zero_info(
            f"mlm_adapt data: {describe_stats(self.corpus_stats)}"
            + f" (max_seq_length {self.hparams.max_seq_length}, packing {self.blocks.packing})"
        )

    def _check_maskable(self, train: datasets.Dataset) -> None:
        hp = self.hparams
        key = (
            "data.prepared_dir"
            if hp.prepared_dir
            else "data.dataset_name"
            if hp.dataset_name
            else "data.train_files"
        )
        refuse_unmaskable(train, self.tokenizer, key, hp.tokenizer_name_or_path)

    def _setup_prepared(self) -> None:
        """``setup`` from ``prepared_dir``: memory-maps the shards after checking the manifest's settings."""
        blocks, manifest = load_prepared(self)
        self._check_maskable(blocks["train"])
        self.train_dataset = blocks["train"]
        self._set_eval_datasets(blocks)
        self.corpus_stats = corpus_stats(manifest["splits"], manifest["validation_sets"])
        rank_zero_info(f"mlm_adapt data: {self.hparams.prepared_dir}: {describe_stats(self.corpus_stats)}")

    def _setup_streaming(self) -> None:
        """``setup`` for ``streaming=True``: opens the training stream, loads validation/test in memory."""
        hp = self.hparams
        documents, files = open_stream(hp)
        splits, held_out = self._read_eval_files()
        fraction = hp.validation_split if held_out else 0.0
        self.train_stream = StreamingCorpus(documents, fraction, self.seed, files)
        if held_out:
            splits[held_out] = self.train_stream.validation_documents(self.streaming.validation_documents)
        blocks = self.make_blocks(datasets.DatasetDict(splits))
        self._set_eval_datasets(blocks)
        self.corpus_stats = {
            "validation_documents": len(splits["validation"]),
            "validation_examples": len(self.val_dataset),
            **{f"validation_{name}_examples": len(d) for name, d in list(self.val_datasets.items())[1:]},
        }
        rank_zero_info(
            f"mlm_adapt data: streaming training data; {len(self.val_dataset):,} validation blocks"
        )

    def _set_eval_datasets(self, blocks: datasets.DatasetDict) -> None:
        """Sets the validation and test datasets, and the replay of the general blocks."""
        self.val_datasets = {name: blocks[split] for name, split in self.validation_sets.splits.items()}
        self.val_dataset = next(iter(self.val_datasets.values()))
        self.test_dataset = blocks.get("test", self.val_dataset)
        if "mix" in blocks:
            budget = self.forgetting.budget
            if max(rate for _, rate in self.replay.schedule.points) == 0 and budget is None:
                rank_zero_warn(IDLE_REPLAY)
            self.replayer = Replay(
                KeyedDataset(blocks["mix"]).blocks,
                self.replay.schedule,
                budget,
                self.forgetting.max_replay_rate,
            )
            if self._replay_state is not None:
                self.replayer.load_state_dict(self._replay_state)

    def _loader(
        self, dataset: Dataset, batch_size: int, sampler=None, stateful: bool = False, collator=None
    ) -> DataLoader:
        workers = self.hparams.num_workers
        # The train loader is stateful: Lightning stores its state_dict in checkpoints, so a resumed fit
        # continues mid-epoch at the next unseen batch instead of replaying or skipping the epoch's start.
        # Its state loads under another data.num_workers too (the workers hold no position).
        loader_class = WorkerCountFreeLoader if stateful else DataLoader
        return loader_class(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=collator or self.collator,
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=torch.cuda.is_available(),
        )

    @override
    def train_dataloader(self) -> DataLoader:
        hp, trainer = self.hparams, self.trainer
        world_size, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        if self.streaming.enabled:
            if trainer is not None and trainer.max_steps < 0:
                raise MLMAdaptError(
                    "trainer.max_steps: set it when data.streaming.enabled is true (a stream has no length)"
                )
            blocks = self.train_stream.rank_blocks(
                rank, world_size, self.streaming.shuffle_buffer_size, self.make_blocks
            )
            return self._loader(blocks, hp.batch_size, stateful=True, collator=self.train_collator)
        grouped = self.blocks.group_by_length and not self.blocks.packing
        sampler = train_sampler(self.train_dataset, world_size, rank, self.seed, grouped, hp.batch_size)
        if not self.masking.schedule.constant:
            sampler.mlm_probabilities = ScheduledRates(self.masking.schedule, hp.batch_size, self._stepping)
        dataset = KeyedDataset(self.train_dataset)
        return self._loader(dataset, hp.batch_size, sampler, stateful=True, collator=self.train_collator)

    def _stepping(self, loader_batches: int) -> Stepping:
        return trainer_stepping(self.trainer, loader_batches)

    @override
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Replay is drawn here, in the main process right before the step, so the rate of step s is the
        # rate after every forgetting check before s, whatever the workers prefetched (data/replay.py).
        trainer = self.trainer
        collated = isinstance(batch, dict) and "example_keys" in batch  # not e.g. the model summary's input
        if self.replayer is None or trainer is None or not trainer.training or not collated:
            return batch
        return self.with_replay(batch, trainer.global_step, int(trainer.estimated_stepping_batches))

    def with_replay(self, batch: dict[str, torch.Tensor], step: int, total: int) -> dict[str, torch.Tensor]:
        """A training batch as optimizer step ``step`` of ``total`` gets it: general blocks replayed into the
        rows drawn at that step's rate (``replayed`` marks them)."""
        rate = self.replayer.rate(step, total)
        schedule = self.masking.schedule
        mlm_probability = None if schedule.constant else schedule.rate_at_step(step, total)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return self.replayer.mix(batch, rate, self.train_collator, pad, mlm_probability)

    @override
    def state_dict(self) -> dict[str, Any]:
        trainer = self.trainer
        state: dict[str, Any] = {
            "replay_segments": self.replay_segments,
            "step": int(trainer.global_step) if trainer is not None else 0,
        }
        if self.replayer is not None:
            state["replay"] = self.replayer.state_dict()
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A checkpoint's replay state and segments; a replay setting that differs from the checkpoint's last
        segment is one line naming the old and new values, and a new segment from the checkpoint's step (the
        card reports each)."""
        replay_state = state_dict.get("replay")
        segments = state_dict["replay_segments"]
        self.replay_segments = self._resumed_segments(segments, state_dict["step"], replay_state)
        self._replay_state = replay_state
        if self.replayer is not None and replay_state is not None:
            self.replayer.load_state_dict(replay_state)

    def _resumed_segments(self, segments: list[list[Any]], step: int, replay_state: Any) -> list[list[Any]]:
        """``segments`` with one more from ``step`` when this run's replay settings differ from the last."""
        current = replay_settings(self.replay, self.forgetting)
        line = resume_line(step, segments[-1][1], current, bool((replay_state or {}).get("checks")))
        if line is None or (self.trainer is not None and self.trainer.state.fn != "fit"):
            return segments  # validate/test read the weights only: no segment of training
        rank_zero_info(line)
        return [*segments, [step, current]]

    def replay_report(self, until_step: int | None = None) -> dict[str, Any]:
        """:func:`~mlm_adapt.data.replay.replay_summary` of this run: its replay state and segments, up to
        the weights of ``until_step`` when given."""
        state = self.replayer.state_dict() if self.replayer is not None else None
        return replay_summary(state, self.replay_segments, until_step)

    @property
    def eval_batch_size(self) -> int:
        """Validation and test examples per batch (``eval_batch_size``, else ``batch_size``); the downstream
        tasks' forward passes, the forgetting checks and merges use it too."""
        return self.hparams.eval_batch_size or self.hparams.batch_size  # never 0: refused in __init__

    @property
    def cache_dir(self) -> str | None:
        """Where ``datasets`` caches loaded data (``None``: its own cache), the downstream tasks' too."""
        return self.hparams.cache_dir

    @override
    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        # One loader per set; Lightning passes its index to validation_step as ``dataloader_idx``.
        loaders = [self._loader(KeyedDataset(d), self.eval_batch_size) for d in self.val_datasets.values()]
        return loaders[0] if len(loaders) == 1 else loaders

    @override
    def test_dataloader(self) -> DataLoader:
        return self._loader(KeyedDataset(self.test_dataset), self.eval_batch_size)
