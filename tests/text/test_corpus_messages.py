"""Messages about corpus files name the file, the 1-based line, what the value was, the right hint."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_datamodule

from mlm_adapt.errors import MLMAdaptError


def setup_error(tiny_model_dir: Path, tmp_path: Path, path: Path) -> str:
    """The message of the ``MLMAdaptError`` that setting up a DataModule over ``path`` raises."""
    datamodule = make_datamodule(tiny_model_dir, path, tmp_path)
    with pytest.raises(MLMAdaptError) as raised:
        datamodule.setup("fit")
    return str(raised.value)


def test_malformed_jsonl_line_is_named(tiny_model_dir, tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "北京欢迎你"}\n{"text": "今天天气很好"}\n{"text": 坏的}\n', encoding="utf-8")
    message = setup_error(tiny_model_dir, tmp_path, path)
    assert "docs.jsonl line 3" in message and "JSON" in message


def test_numeric_text_value_says_what_it_was(tiny_model_dir, tmp_path):
    path = tmp_path / "numbers.jsonl"
    path.write_text("".join(f'{{"text": {12345 + i}}}\n' for i in range(5)), encoding="utf-8")
    message = setup_error(tiny_model_dir, tmp_path, path)
    assert "12345" in message and "numbers.jsonl" in message
    assert "set data.text_column" not in message


def test_utf16_file_gets_the_utf16_hint(tiny_model_dir, tmp_path, review_texts):
    path = tmp_path / "utf16.txt"
    path.write_text("\n".join(review_texts[:20]) + "\n", encoding="utf-16")  # with a byte-order mark
    message = setup_error(tiny_model_dir, tmp_path, path)
    assert "UTF-16" in message and "iconv -f UTF-16 -t UTF-8" in message and "GB18030" not in message


def test_binary_file_is_not_a_text_file(tiny_model_dir, tmp_path):
    path = tmp_path / "model.txt"
    path.write_bytes(bytes(range(256)) * 16)
    message = setup_error(tiny_model_dir, tmp_path, path)
    assert "model.txt is not a text file" in message and "iconv" not in message


def test_gb18030_hint_only_for_gb18030_bytes(tiny_model_dir, tmp_path, review_texts):
    path = tmp_path / "latin1.txt"
    path.write_bytes(("\n".join(review_texts[:4]) + "\n").encode() + "café au lait\n".encode("latin-1"))
    message = setup_error(tiny_model_dir, tmp_path, path)
    assert "latin1.txt line 5 is not UTF-8" in message and "GB18030" not in message
    gbk = tmp_path / "gbk.txt"
    gbk.write_bytes(("\n".join(review_texts[:4]) + "\n").encode() + "第五行是GBK编码\n".encode("gbk"))
    message = setup_error(tiny_model_dir, tmp_path, gbk)
    assert "gbk.txt line 5 is not UTF-8" in message and "iconv -f GB18030" in message


def test_directory_is_a_directory(tiny_model_dir, tmp_path):
    folder = tmp_path / "corpus_dir"
    folder.mkdir()
    (folder / "a.txt").write_text("北京欢迎你\n", encoding="utf-8")
    message = setup_error(tiny_model_dir, tmp_path, folder)
    assert "is a directory" in message and "matches no file" not in message
    assert str(folder / "*.txt") in message  # the glob that would work
