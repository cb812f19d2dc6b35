"""Samplers of the training loader: ``ExampleKey`` s (epoch, index) for the masking hash, length grouping."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import datasets
import numpy as np
import pyarrow.compute as pc
import torch
from torch.utils.data import Dataset, DistributedSampler
from typing_extensions import override

from mlm_adapt.masking.schedule import ExampleKey, ScheduledRates


class EpochSampler(DistributedSampler):
    """A ``DistributedSampler`` (Lightning calls its ``set_epoch`` and keeps it under DDP) that yields
    :class:`~mlm_adapt.masking.schedule.ExampleKey` s, so the collator draws new masks each epoch; with
    ``mlm_probabilities`` (a masking-rate schedule) each carries the rate of the step its batch feeds.

    Ranks take the epoch's global order in turn (rank ``r`` of ``W``: positions ``r, r + W, ...``), so the
    ``W`` batches ``i`` of a step are one contiguous slice of it, whatever ``W``. :meth:`resume_at` starts
    an epoch at a global position: a run resumed on another number of ranks continues the same order.
    """

    mlm_probabilities: ScheduledRates | None = None
    _resume: tuple[int, int] | None = None  # (epoch, examples of it all ranks had drawn)

    def resume_at(self, epoch: int, consumed: int) -> None:
        """Start ``epoch`` after its first ``consumed`` examples of the global order (later epochs whole)."""
        self._resume = (epoch, max(0, consumed))

    def _consumed(self) -> int:
        return self._resume[1] if self._resume is not None and self._resume[0] == self.epoch else 0

    def _global_order(self) -> list[int]:
        """The epoch's examples, all ranks together, as ``DistributedSampler`` orders them."""
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=generator).tolist()
        else:
            order = list(range(len(self.dataset)))
        if self.drop_last:
            return order[: self.total_size]
        repeats = math.ceil(self.total_size / max(len(order), 1))
        return (order * repeats)[: self.total_size]

    def _share(self, order: list[int]) -> list[int]:
        """This rank's part of ``order`` from the resumed position: equal parts, the tail that does not
        divide among the ranks dropped."""
        rest = order[min(self._consumed(), len(order)) :]
        rest = rest[: len(rest) - len(rest) % self.num_replicas]
        return rest[self.rank :: self.num_replicas]

    def _keyed(self, indices: Iterable[int]):
        epoch = self.epoch
        if self.mlm_probabilities is not None:
            full = self.total_size // self.num_replicas
            return self.mlm_probabilities.keyed(epoch, indices, full, self._consumed() // self.num_replicas)
        return (ExampleKey(epoch, index) for index in indices)

    @override
    def __iter__(self):
        return self._keyed(self._share(self._global_order()))

    @override
    def __len__(self) -> int:
        rest = max(0, self.total_size - self._consumed())
        return rest // self.num_replicas


class LengthGroupedEpochSampler(EpochSampler):
    """An :class:`EpochSampler` that puts examples of similar length in the same batch (less padding).

    Each epoch starts from the same seeded shuffle as ``DistributedSampler``; the shuffled order is cut into
    mega-batches of ``megabatch_size`` examples per rank (50 batches, as ``transformers``'
    ``LengthGroupedSampler``), each sorted by ``lengths`` (longest first), then dealt out round-robin to the
    ranks, so every rank's batch ``i`` has similar lengths too (no rank waits for a longer one). Padding and
    ``drop_last`` follow ``DistributedSampler``; each example keeps its masks: only its batch changes.
    """

    def __init__(
        self,
        dataset: Any,
        lengths: Sequence[int] | np.ndarray,
        megabatch_size: int,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
    ):
        super().__init__(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=drop_last
        )
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if len(self.lengths) != len(dataset):
            raise ValueError(f"got {len(self.lengths)} lengths for {len(dataset)} examples")
        self.megabatch_size = max(1, megabatch_size)

    @override
    def __iter__(self):
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        perm = torch.randperm(len(self.lengths), generator=generator).numpy()
        # The same examples as DistributedSampler: it drops the shuffled tail, or repeats the shuffled head.
        if self.drop_last:
            perm, extra = perm[: self.total_size], []
        else:
            repeats = math.ceil(self.total_size / max(len(perm), 1))
            extra = np.tile(perm, repeats)[: self.total_size - len(perm)].tolist()
        group = np.arange(len(perm)) // (self.megabatch_size * self.num_replicas)
        indices = perm[np.lexsort((-self.lengths[perm], group))].tolist() + extra  # by group, longest first
        return self._keyed(self._share(indices[: self.total_size]))


class KeyedDataset(Dataset):
    """Serves block rows with their dataset index (and epoch) attached, as the collator expects."""

    def __init__(self, blocks: datasets.Dataset):
        self.blocks = blocks.with_format("numpy")

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, key: int | tuple) -> dict[str, Any]:
        epoch, index, rate = ExampleKey(*key) if isinstance(key, tuple) else ExampleKey(0, key)
        return keyed_item(self.blocks[int(index)], index, epoch, rate)


def keyed_item(
    row: dict[str, Any], example_id: int, epoch: int, mlm_probability: float | None
) -> dict[str, Any]:
    """A block row as the collator takes it: its masking key (and the masking rate of its step, if any)."""
    item = {
        "input_ids": row["input_ids"],
        "word_ids": row["word_ids"],
        "example_id": example_id,
        "epoch": epoch,
    }
    if mlm_probability is not None:
        item["mlm_probability"] = mlm_probability
    return item


def train_sampler(
    blocks: datasets.Dataset, world_size: int, rank: int, seed: int, group_by_length: bool, batch_size: int
) -> EpochSampler:
    """The training loader's sampler: length-grouped (mega-batches of 50 batches) or a seeded shuffle.

    ``drop_last``: ranks get disjoint, equal shards (padding would repeat examples on some ranks); the
    fewer than ``world_size`` examples left out differ every epoch because the shuffle does.
    """
    if group_by_length:
        lengths = pc.list_value_length(blocks.with_format("arrow")["input_ids"]).to_numpy()
        return LengthGroupedEpochSampler(
            blocks, lengths, 50 * batch_size, world_size, rank, seed=seed, drop_last=True
        )
    return EpochSampler(blocks, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
