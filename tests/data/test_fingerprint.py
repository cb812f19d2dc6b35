"""The training-corpus fingerprint that a resume compares: stable for the same data, not for other data."""

from __future__ import annotations

import shutil

import pytest
from conftest import make_datamodule

from mlm_adapt.data.loader_state import corpus_fingerprint
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.training import ResumeMatch


def fingerprint(model_dir, corpus, cache_root, **overrides) -> str:
    datamodule = make_datamodule(model_dir, corpus, cache_root, validation_split=0.1, **overrides)
    datamodule.setup("fit")
    return corpus_fingerprint(datamodule)


def test_same_corpus_moved_keeps_its_fingerprint_other_data_does_not(tiny_model_dir, corpus_file, tmp_path):
    original = fingerprint(tiny_model_dir, corpus_file, tmp_path)
    moved = tmp_path / "elsewhere" / "reviews.txt"
    moved.parent.mkdir()
    shutil.copy(corpus_file, moved)
    assert fingerprint(tiny_model_dir, moved, tmp_path) == original
    other = tmp_path / "other" / "reviews.txt"
    other.parent.mkdir()
    lines = corpus_file.read_text(encoding="utf-8").splitlines()
    other.write_text("\n".join(lines[: len(lines) // 2]) + "\n", encoding="utf-8")
    assert fingerprint(tiny_model_dir, other, tmp_path) != original
    assert fingerprint(tiny_model_dir, corpus_file, tmp_path, max_seq_length=32) != original


def test_resume_on_another_corpus_is_refused():
    match = ResumeMatch()
    match.corpus_fingerprint = "b" * 32

    def checkpoint(fingerprint: str) -> dict:
        return {"callbacks": {"ResumeMatch": {"corpus_fingerprint": fingerprint}}}

    match.check(checkpoint("b" * 32))  # the same corpus: fine
    with pytest.raises(
        MLMAdaptError, match=r"cannot resume .*training corpus: fingerprint aaaaaaaaaaaa -> bbbb"
    ):
        match.check(checkpoint("a" * 32))


def stream_fingerprint(*paths) -> str:
    """The fingerprint of a streamed corpus of ``paths`` (what the data module has after ``setup``)."""
    from types import SimpleNamespace

    return corpus_fingerprint(
        SimpleNamespace(
            train_dataset=None, train_stream=object(), hparams={"train_files": list(map(str, paths))}
        )
    )


@pytest.mark.parametrize("lines", [600, 20_000], ids=["small_file_read_whole", "large_file_sampled"])
def test_a_streamed_corpus_is_fingerprinted_by_its_content_not_its_names_and_sizes(
    review_texts, tmp_path, lines
):
    texts = (review_texts * (lines // len(review_texts) + 1))[:lines]
    texts = [f"{i:06d} {text}" for i, text in enumerate(texts)]  # distinct lines: a shuffle moves bytes
    corpus = tmp_path / "a" / "reviews.txt"
    corpus.parent.mkdir()
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    original = stream_fingerprint(corpus)
    renamed = tmp_path / "b" / "renamed.txt"
    renamed.parent.mkdir()
    shutil.copy(corpus, renamed)
    assert stream_fingerprint(renamed) == original  # moved and renamed: the same text
    reshuffled = tmp_path / "c" / "reviews.txt"  # the same name, the same size, the lines in another order
    reshuffled.parent.mkdir()
    reshuffled.write_text("\n".join(texts[1::2] + texts[::2]) + "\n", encoding="utf-8")
    assert reshuffled.stat().st_size == corpus.stat().st_size
    assert stream_fingerprint(reshuffled) != original
