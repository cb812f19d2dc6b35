"""A corpus file that exists is that file, whatever its name: ``reviews[2023].txt`` is read, not globbed
into ``reviews2.txt`` (by mlm_adapt or by ``datasets``), in memory, streamed and as a downstream table."""

from __future__ import annotations

import glob
import json
from types import SimpleNamespace

import pytest

from mlm_adapt.data.streaming import open_stream
from mlm_adapt.downstream.tasks import load_table
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.corpus import load_files
from mlm_adapt.text.files import expand_files


@pytest.fixture
def bracketed(tmp_path):
    """``reviews[2023].txt`` beside ``reviews2.txt``, the file its name matches as a glob."""
    (tmp_path / "reviews[2023].txt").write_text("这家酒店很好\n房间干净\n", encoding="utf-8")
    (tmp_path / "reviews2.txt").write_text("别的文件\n", encoding="utf-8")
    return tmp_path


def test_an_existing_file_is_that_file(bracketed):
    name = str(bracketed / "reviews[2023].txt")
    assert expand_files([name], "data.train_files") == [name]
    # An escaped glob still reaches the file, as does a glob of both.
    assert expand_files([glob.escape(name)], "data.train_files") == [name]
    assert len(expand_files([str(bracketed / "reviews*.txt")], "data.train_files")) == 2
    with pytest.raises(MLMAdaptError, match=r"data.train_files: .*notes\[2023\].txt' matches no file"):
        expand_files([str(bracketed / "notes[2023].txt")], "data.train_files")


def test_datasets_reads_the_named_file_in_memory_and_streamed(bracketed):
    files = expand_files([str(bracketed / "reviews[2023].txt")], "data.train_files")
    assert load_files(files, "data.train_files", "text", str(bracketed / "cache"))["text"] == [
        "这家酒店很好",
        "房间干净",
    ]
    hp = SimpleNamespace(dataset_name=None, train_files=files, text_column="text")
    stream, _ = open_stream(hp)
    assert [row["text"] for row in stream] == ["这家酒店很好", "房间干净"]


def test_a_downstream_table_is_the_named_file(tmp_path):
    rows = [{"text": "好", "label": 1}, {"text": "差", "label": 0}]
    (tmp_path / "test[v1].jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows))
    (tmp_path / "testv.jsonl").write_text(json.dumps({"text": "别的", "label": 1}, ensure_ascii=False))
    files = expand_files([str(tmp_path / "test[v1].jsonl")], "downstream.tasks[0].test_files")
    table = load_table(files, "downstream.tasks[0].test_files", {"text": "text"}, 0, str(tmp_path / "cache"))
    assert table["text"] == ["好", "差"]
