"""A non-UTF-8 line in a streamed corpus is named (file and 1-based line), in and out of workers."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_datamodule

from mlm_adapt.cli import main
from mlm_adapt.errors import MLMAdaptError


def _gbk_corpus(tmp_path: Path, review_texts: list[str], bad_line: int) -> Path:
    path = tmp_path / "stream" / "mixed.txt"
    path.parent.mkdir(parents=True)
    lines = [text.encode() for text in review_texts[:60]]
    lines.insert(bad_line - 1, "这一行是GBK编码的".encode("gbk"))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _validation(tmp_path: Path, review_texts: list[str]) -> Path:
    path = tmp_path / "val.txt"
    path.write_text("\n".join(review_texts[500:520]) + "\n", encoding="utf-8")
    return path


def test_streaming_setup_names_file_and_line(tiny_model_dir, review_texts, tmp_path):
    # Without validation_files, setup reads held-out documents from the stream: the error comes from there.
    corpus = _gbk_corpus(tmp_path, review_texts, bad_line=40)
    datamodule = make_datamodule(tiny_model_dir, corpus, tmp_path, streaming={"enabled": True})
    with pytest.raises(MLMAdaptError, match=r"mixed\.txt line 40 is not UTF-8.*iconv -f GB18030"):
        datamodule.setup("fit")


def test_streaming_training_batches_name_file_and_line(tiny_model_dir, review_texts, tmp_path):
    corpus = _gbk_corpus(tmp_path, review_texts, bad_line=55)
    datamodule = make_datamodule(
        tiny_model_dir,
        corpus,
        tmp_path,
        streaming={"enabled": True},
        validation_files=[str(_validation(tmp_path, review_texts))],
    )
    datamodule.setup("fit")
    with pytest.raises(MLMAdaptError, match=r"mixed\.txt line 55 is not UTF-8"):
        for _ in datamodule.train_dataloader():
            pass


def test_streaming_error_from_a_worker_is_one_line(tiny_model_dir, review_texts, tmp_path, capsys):
    corpus = _gbk_corpus(tmp_path, review_texts, bad_line=55)
    args = [
        "preview",
        f"--model.model_name_or_path={tiny_model_dir}",
        "--model.max_seq_length=64",
        f"--data.train_files=[{corpus}]",
        f"--data.validation_files=[{_validation(tmp_path, review_texts)}]",
        "--data.streaming.enabled=true",
        "--data.num_workers=1",
        "--data.batch_size=8",
        f"--data.cache_dir={tmp_path / 'cache'}",
        "--num_examples=1000",
    ]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2
    assert err[-1].startswith("mlm_adapt: error: data.train_files: ") and "mixed.txt line 55" in err[-1]
    assert not any("Traceback" in line or "Original" in line for line in err)
