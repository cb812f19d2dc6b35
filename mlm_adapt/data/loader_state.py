"""What a resume needs of the data: a train loader position that survives a change of ``data.num_workers``,
and a fingerprint of the training data that tells whether that position still means the same batches.

torchdata's ``StatefulDataLoader`` stores its position in one of two layouts: single-process (``num_workers
0``: the sampler state and the number of batches yielded) and multi-process (a ``_snapshot`` with one
entry per worker). Loading one layout into a loader with the other fails ("State doesn't contain key
'_snapshot'"), yet the number of workers is no property of the run: the batches are drawn by the sampler
in the main process, and the workers of a map-style dataset hold no state. :func:`convert_loader_state`
rewrites the saved layout for the current worker count; states with worker-held data (a streamed corpus:
each worker reads its own share of the stream) cannot move between counts and are refused with one line.

Hashing the whole corpus would cost seconds per gigabyte at every start, so :func:`corpus_fingerprint` hashes
the number of training blocks and :data:`SAMPLES` evenly spaced blocks: a different corpus, split, tokenizer
or block length changes it, while moving or touching the files (unlike ``datasets``' cache fingerprint,
which hashes paths and modification times) does not. A stream's fingerprint hashes, file by file in order,
its size and :data:`SAMPLES` evenly spaced pieces of its bytes (the whole file when it is small): the same
lines in another order, or other text of the same size, change it; a renamed or moved file does not.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader
from typing_extensions import override

from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.files import expand_files

SAMPLES = 64
PIECE = 4096  # bytes of each sampled piece of a streamed file
SNAPSHOT = "_snapshot"
# Main-process entries shared by both layouts.
_MAIN_KEYS = (
    "_sampler_iter_state",
    "_index_sampler_state",
    "_sampler_iter_yielded",
    "_IterableDataset_len_called",
    "_shared_seed",
)


def convert_loader_state(state: dict[str, Any], num_workers: int) -> dict[str, Any]:
    """``state`` (of any worker count) in the layout of a loader with ``num_workers`` workers; refused when
    the saved workers hold data state (a streamed corpus) and the count changed."""
    snapshot = state.get(SNAPSHOT)
    saved = int(snapshot["_main_snapshot"]["_num_workers"]) if snapshot is not None else 0
    if saved == num_workers:
        return state
    workers = snapshot["_worker_snapshots"].values() if snapshot is not None else [state]
    if any(w.get("dataset_state") is not None or w.get("fetcher_state") is not None for w in workers):
        raise MLMAdaptError(
            f"data.num_workers: the checkpoint's data position was saved with {saved} workers, each holding "
            f"its share of the streamed corpus; resume with --data.num_workers={saved}"
        )
    if snapshot is not None:
        main = snapshot["_main_snapshot"]
        yielded = int(snapshot["_snapshot_step"]) + int(state.get("_steps_since_snapshot", 0))
    else:
        main, yielded = state, int(state.get("_num_yielded", 0))
    common = {key: main.get(key) for key in _MAIN_KEYS}
    finished = bool(state.get("_iterator_finished", False))
    if num_workers == 0:
        empty = {"fetcher_state": None, "dataset_state": None}
        return {**common, "_num_yielded": yielded, **empty, "_iterator_finished": finished}
    return {
        SNAPSHOT: {
            "_snapshot_step": yielded,
            # Workers take batches in turn: the next batch comes from the worker after the last one's.
            "_last_yielded_worker_id": (yielded - 1) % num_workers,
            "_main_snapshot": {
                **common,
                "_num_workers": num_workers,
                "_base_seed": main.get("_base_seed", 0),
            },
            "_worker_snapshots": {
                f"worker_{i}": {"worker_id": i, "dataset_state": None, "fetcher_state": None}
                for i in range(num_workers)
            },
        },
        "_steps_since_snapshot": 0,
        "_iterator_finished": finished,
    }


class WorkerCountFreeLoader(StatefulDataLoader):
    """``StatefulDataLoader`` that loads a state saved with another ``num_workers`` (see the module)."""

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(convert_loader_state(state_dict, self.num_workers))


def _digest(payload: Any) -> str:
    return hashlib.blake2b(json.dumps(payload, sort_keys=True).encode(), digest_size=16).hexdigest()


def blocks_fingerprint(dataset: Any) -> str:
    """Fingerprint of a block table (a ``datasets.Dataset``): its length and :data:`SAMPLES` spaced rows."""
    n = len(dataset)
    indices = sorted({(i * n) // SAMPLES for i in range(SAMPLES)}) if n else []
    rows = dataset.select(indices)["input_ids"] if indices else []
    return _digest({"blocks": n, "sample": [list(map(int, row)) for row in rows]})


def corpus_fingerprint(datamodule: Any) -> str | None:
    """The fingerprint of an ``MLMDataModule``'s training data after ``setup`` (``None``: not known)."""
    train = getattr(datamodule, "train_dataset", None)
    if train is not None:
        return blocks_fingerprint(train)
    files = getattr(datamodule, "hparams", {}).get("train_files")
    if getattr(datamodule, "train_stream", None) is None or not files:
        return None
    paths = expand_files(files, "data.train_files")
    return _digest({"files": [file_fingerprint(path) for path in paths]})


def file_fingerprint(path: str) -> list[Any]:
    """A file's size and the digest of :data:`SAMPLES` evenly spaced pieces of :data:`PIECE` bytes."""
    size = os.path.getsize(path)
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        if size <= SAMPLES * PIECE:
            digest.update(handle.read())
        else:
            for i in range(SAMPLES):
                handle.seek(i * (size - PIECE) // (SAMPLES - 1))
                digest.update(handle.read(PIECE))
    return [size, digest.hexdigest()]
