"""DataModule: file formats, Hub-style dataset dirs, splits, caching, and the loaders' keys."""

import json

import pytest
from conftest import make_datamodule

from mlm_adapt.data import MLMDataModule
from mlm_adapt.data.samplers import EpochSampler


def make_data(model_dir, tmp_path, **kwargs) -> MLMDataModule:
    return make_datamodule(model_dir, None, tmp_path, batch_size=4, **kwargs)


def test_reads_txt_jsonl_csv_and_parquet_with_a_text_column(tiny_model_dir, tmp_path, review_texts):
    import pandas as pd

    texts = review_texts[:40]
    (tmp_path / "a.txt").write_text("\n".join(texts[:10]), encoding="utf-8")
    (tmp_path / "b.jsonl").write_text(
        "\n".join(json.dumps({"body": t}) for t in texts[10:20]), encoding="utf-8"
    )
    pd.DataFrame({"body": texts[20:30]}).to_csv(tmp_path / "c.csv", index=False)
    pd.DataFrame({"body": texts[30:40]}).to_parquet(tmp_path / "d.parquet")
    (tmp_path / "a2.txt").write_text("\n".join(texts[:10]), encoding="utf-8")
    data = make_data(
        tiny_model_dir,
        tmp_path,
        train_files=[str(tmp_path / "a.txt")],
        validation_files=[str(tmp_path / "a2.txt")],
        text_column="text",
    )
    data.setup("fit")
    assert data.corpus_stats["train_documents"] == 10
    data = make_data(
        tiny_model_dir,
        tmp_path,
        train_files=[str(tmp_path / "[bcd].*")],
        text_column="body",
        validation_split=0.1,
    )
    data.setup("fit")
    assert data.corpus_stats["train_documents"] + data.corpus_stats["validation_documents"] == 30


def test_dataset_name_accepts_a_local_dataset_dir_with_splits(tiny_model_dir, tmp_path, review_texts):
    root = tmp_path / "my_dataset"
    root.mkdir()
    (root / "train.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in review_texts[:50]), "utf-8")
    (root / "validation.jsonl").write_text(
        "\n".join(json.dumps({"text": t}) for t in review_texts[50:60]), "utf-8"
    )
    data = make_data(tiny_model_dir, tmp_path, dataset_name=str(root))
    data.setup("fit")
    assert data.corpus_stats["train_documents"] == 50 and data.corpus_stats["validation_documents"] == 10


def test_validation_split_is_seeded_and_disjoint(tiny_model_dir, corpus_file, tmp_path):
    first = make_data(tiny_model_dir, tmp_path, train_files=[str(corpus_file)], validation_split=0.2, seed=3)
    second = make_data(tiny_model_dir, tmp_path, train_files=[str(corpus_file)], validation_split=0.2, seed=3)
    for data in (first, second):
        data.setup("fit")
    assert first.val_dataset["input_ids"] == second.val_dataset["input_ids"]
    train = {tuple(x) for x in first.train_dataset["input_ids"]}
    assert not train & {tuple(x) for x in first.val_dataset["input_ids"]}


def test_second_setup_reuses_the_preprocessing_cache(tiny_model_dir, corpus_file, tmp_path):
    data = make_data(tiny_model_dir, tmp_path, train_files=[str(corpus_file)])
    data.prepare_data()
    cached = {f.name for f in (tmp_path / "cache").rglob("cache-*.arrow")}
    again = make_data(tiny_model_dir, tmp_path, train_files=[str(corpus_file)])
    again.setup("fit")
    assert cached and {f.name for f in (tmp_path / "cache").rglob("cache-*.arrow")} == cached


def test_train_loader_tags_examples_with_epoch_and_differs_per_epoch(tiny_model_dir, corpus_file, tmp_path):
    data = make_data(tiny_model_dir, tmp_path, train_files=[str(corpus_file)])
    data.setup("fit")
    loader = data.train_dataloader()
    assert isinstance(loader.sampler, EpochSampler)
    keys = list(loader.sampler)
    assert all(key.epoch == 0 for key in keys) and len({key.index for key in keys}) == len(data.train_dataset)
    first = next(iter(loader))["labels"]
    loader.sampler.set_epoch(1)
    assert {key.epoch for key in loader.sampler} == {1}
    assert not next(iter(loader))["labels"].equal(first)
    val_first = next(iter(data.val_dataloader()))
    assert next(iter(data.val_dataloader()))["labels"].equal(val_first["labels"])


def test_ranks_get_disjoint_equal_shards(tiny_model_dir, corpus_file, tmp_path):
    data = make_data(tiny_model_dir, tmp_path, train_files=[str(corpus_file)])
    data.setup("fit")
    shards = []
    for rank in (0, 1):
        data.trainer = type("FakeTrainer", (), {"world_size": 2, "global_rank": rank})()
        shards.append([key.index for key in data.train_dataloader().sampler])
    assert len(shards[0]) == len(shards[1]) == len(data.train_dataset) // 2
    assert not set(shards[0]) & set(shards[1])


def test_rejects_bad_settings_early(tiny_model_dir, tmp_path):
    from mlm_adapt.errors import MLMAdaptError

    with pytest.raises(MLMAdaptError, match="data.train_files is empty"):
        make_data(tiny_model_dir, tmp_path)
    with pytest.raises(MLMAdaptError, match="data.validation_split"):
        make_data(tiny_model_dir, tmp_path, train_files=["x.txt"], validation_split=1.5)
