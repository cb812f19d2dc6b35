"""A training corpus of which no token can be masked (all ``[UNK]`` to the tokenizer: emoji) trained with loss
0 and exported unchanged weights; it is refused before training, in one line with the ``[UNK]`` share and the
fix. A corpus with some maskable text trains."""

from __future__ import annotations

import random

import pytest
from conftest import make_datamodule, run_cli, tiny_fit_args

from mlm_adapt.errors import MLMAdaptError

EMOJI = ["😀", "😂", "🥰", "👍", "🎉", "🔥", "💯", "🙏", "😭", "🤔"]


def emoji_lines(count: int = 120) -> list[str]:
    draw = random.Random(0)
    return ["".join(draw.choice(EMOJI) for _ in range(30)) for _ in range(count)]


def test_a_corpus_the_tokenizer_does_not_cover_is_refused_before_training(tiny_model_dir, tmp_path):
    corpus = tmp_path / "emoji.txt"
    corpus.write_text("\n".join(emoji_lines()) + "\n", encoding="utf-8")
    result = run_cli("fit", *tiny_fit_args(tiny_model_dir, corpus, tmp_path / "run"))
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("mlm_adapt: error:")]
    assert line.startswith(
        "mlm_adapt: error: data.train_files: no token of the training corpus can be masked: 100.0% of its "
        "tokens are [UNK]"
    ), line
    assert "python -m mlm_adapt vocab --output_tokens FILE, then model.new_tokens_file FILE" in line
    assert not list((tmp_path / "run").rglob("*.ckpt")) and not (tmp_path / "run" / "export").exists()


def test_a_prepared_corpus_with_nothing_maskable_is_refused(tiny_model_dir, tmp_path):
    from mlm_adapt.data.prepared import prepare_corpus
    from mlm_adapt.data.progress import Progress

    corpus = tmp_path / "emoji.txt"
    corpus.write_text("\n".join(emoji_lines()) + "\n", encoding="utf-8")
    datamodule = make_datamodule(tiny_model_dir, corpus, tmp_path / "cache", validation_split=0.1)
    prepare_corpus(datamodule, tmp_path / "prepared", Progress("prepare", False))
    prepared = make_datamodule(
        tiny_model_dir,
        None,
        tmp_path / "cache",
        validation_split=0.1,
        prepared_dir=str(tmp_path / "prepared"),
    )
    with pytest.raises(
        MLMAdaptError, match=r"^data.prepared_dir: no token of the training corpus can be masked"
    ):
        prepared.setup("fit")


def test_a_corpus_with_some_covered_text_trains(tiny_model_dir, tmp_path, review_texts):
    """Emoji with a little Chinese: the Chinese is masked; the check refuses only a corpus with nothing."""
    corpus = tmp_path / "mixed.txt"
    lines = emoji_lines()
    for i in (7, 50, 90):
        lines[i] += review_texts[i]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    datamodule = make_datamodule(tiny_model_dir, corpus, tmp_path / "cache", validation_split=0.1)
    datamodule.setup("fit")
    assert len(datamodule.train_dataset) > 0
