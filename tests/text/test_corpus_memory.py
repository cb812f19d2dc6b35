"""Loading a text corpus holds a bounded chunk of it at a time, whatever its size (flat memory)."""

from __future__ import annotations

from datasets.packaged_modules.text.text import Text

from mlm_adapt.text.corpus import TEXT_CHUNK_CHARACTERS, load_files


def test_a_text_corpus_is_read_in_bounded_chunks_and_loses_no_line(tmp_path, review_texts, monkeypatch):
    # datasets' default chunk is 10 M characters (~30 MB of Chinese UTF-8) and two are alive at once as
    # Python strings and Arrow: a 100 MB corpus peaked at +347 MiB while loading, +73 MiB at 10 MB.
    chunks: list[int] = []
    generate = Text._generate_tables

    def recording(self, *args, **kwargs):
        for key, table in generate(self, *args, **kwargs):
            chunks.append(sum(len(text) for text in table.column("text").to_pylist()))
            yield key, table

    monkeypatch.setattr(Text, "_generate_tables", recording)
    lines = [f"{i}{review_texts[i % len(review_texts)]}" for i in range(36_000)]  # ~4.8 M characters
    path = tmp_path / "large.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    dataset = load_files([str(path)], "data.train_files", "text", str(tmp_path / "cache"))
    assert dataset["text"] == lines  # every line, in order, none split at a chunk boundary
    assert len(chunks) > 3 and max(chunks) <= TEXT_CHUNK_CHARACTERS + max(map(len, lines))
