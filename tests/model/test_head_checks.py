"""The masked-LM head is checked at load, for every family the tests build: a full checkpoint loads
silently, an encoder-only one is said in one line and trains, a partial head or an untied decoder is
refused in one line."""

from __future__ import annotations

import csv
import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from conftest import tiny_fit_args
from families import FAMILIES, family_dir
from safetensors.torch import load_file, save_file
from transformers import AutoModelForMaskedLM

from mlm_adapt.cli.commands import main
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.model.loading import (
    HEAD_PARTIAL,
    HEAD_TRAINED,
    HEAD_UNTRAINED,
    check_head,
    head_parameters,
    load_masked_lm,
)


def _copy(family: str, target: Path) -> Path:
    shutil.copytree(family_dir(family), target)
    return target


def encoder_only(family: str, target: Path) -> Path:
    """The family's tiny model saved as its encoder alone (``BertModel``...), as embedders ship."""
    directory = _copy(family, target)
    model = AutoModelForMaskedLM.from_pretrained(directory)
    (directory / "model.safetensors").unlink()
    model.base_model.save_pretrained(directory)
    return directory


def partial_head(family: str, target: Path) -> tuple[Path, str]:
    """The family's tiny model with one tensor of its head deleted from the weight file."""
    directory = _copy(family, target)
    weights = load_file(directory / "model.safetensors")
    prefix = AutoModelForMaskedLM.from_pretrained(directory).base_model_prefix + "."
    dropped = next(name for name in sorted(weights) if not name.startswith(prefix))
    del weights[dropped]
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return directory, dropped


def _load(directory: Path, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, head = load_masked_lm(str(directory), **kwargs)
    lines = [str(w.message) for w in caught if "masked-LM head" in str(w.message)]
    return model, head, lines


@pytest.mark.parametrize("family", FAMILIES)
def test_a_full_checkpoint_loads_silently(family):
    _, head, lines = _load(family_dir(family))
    assert head == HEAD_TRAINED and lines == []


@pytest.mark.parametrize("family", FAMILIES)
def test_an_encoder_only_checkpoint_is_said_in_one_line(family, tmp_path):
    directory = encoder_only(family, tmp_path / family)
    model, head, lines = _load(directory)
    assert head == HEAD_UNTRAINED
    assert len(lines) == 1 and str(directory) in lines[0] and "the head starts untrained" in lines[0], lines
    # It trains: the masked-LM loss reaches the new head and the pretrained encoder.
    ids = torch.randint(5, model.config.vocab_size, (2, 12))
    model(input_ids=ids, labels=ids).loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(g is not None and g.abs().sum() > 0 for n, g in grads.items() if n in head_parameters(model))
    assert grads[next(n for n in grads if n.startswith(model.base_model_prefix + "."))] is not None


@pytest.mark.parametrize("family", FAMILIES)
def test_a_partial_head_is_refused_unless_allowed(family, tmp_path):
    directory, dropped = partial_head(family, tmp_path / family)
    with pytest.raises(MLMAdaptError, match=rf"holds only part of its masked-LM head \(missing {dropped}"):
        _load(directory)
    _, head, lines = _load(directory, allow_partial_head=True)
    assert head == HEAD_PARTIAL and len(lines) == 1 and dropped in lines[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_an_untied_decoder_where_the_config_ties_it_is_refused(family):
    model, _, _ = _load(family_dir(family))
    if not model.config.get_text_config().tie_word_embeddings:
        pytest.skip(f"{family} does not tie its decoder")
    decoder = model.get_output_embeddings()
    decoder.weight = torch.nn.Parameter(decoder.weight.detach().clone())  # what a broken loader leaves
    with pytest.raises(MLMAdaptError, match="decoder is not tied to the input embeddings"):
        check_head(model, [], "m", "model.model_name_or_path")


def test_fit_from_an_encoder_only_checkpoint_says_so_trains_and_the_card_records_it(tmp_path, corpus_file):
    directory = encoder_only("bert", tmp_path / "encoder")
    export = tmp_path / "export"
    args = tiny_fit_args(
        directory, corpus_file, tmp_path, "--trainer.max_steps=2", f"--export.output_dir={export}"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["fit", *args])
    said = [str(w.message) for w in caught if "has no masked-LM head" in str(w.message)]
    assert len(said) == 1 and str(directory) in said[0], said
    card = (export / "README.md").read_text(encoding="utf-8")
    assert "had no masked-LM head (an encoder-only checkpoint)" in card


def test_a_head_warm_up_trains_the_head_alone_and_scores_the_baseline_after_it(tmp_path, corpus_file, capsys):
    directory = encoder_only("bert", tmp_path / "encoder")
    checkpoints, export = tmp_path / "ckpt", tmp_path / "export"
    every_step = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"dirpath": str(checkpoints), "every_n_train_steps": 1, "save_top_k": -1},
    }
    args = tiny_fit_args(
        directory,
        corpus_file,
        tmp_path,
        "--trainer.max_steps=4",
        "--model.head_warmup_steps=2",
        f"--trainer.callbacks+={json.dumps(every_step)}",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={tmp_path}",
        f"--export.output_dir={export}",
    )
    main(["fit", *args])
    base = load_file(directory / "model.safetensors")

    def weights(step: int) -> dict[str, torch.Tensor]:
        (path,) = checkpoints.glob(f"*step={step}*.ckpt")
        state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
        return {k.removeprefix("model."): v for k, v in state.items()}

    encoder = [name for name in base if f"bert.{name}" in weights(2) or name in weights(2)]
    assert encoder
    for step, unchanged in ((2, True), (4, False)):
        state = weights(step)
        same = [torch.equal(state.get(f"bert.{n}", state.get(n)), base[n]) for n in encoder]
        assert all(same) if unchanged else not all(same), step
    head = "cls.predictions.transform.dense.weight"
    assert not torch.equal(weights(1)[head], weights(2)[head])  # the head learns during the warm-up
    (metrics,) = tmp_path.rglob("metrics.csv")
    steps = [int(r["step"]) for r in csv.DictReader(metrics.open()) if r.get("val/loss")]
    assert steps[0] == 2, steps  # the baseline is scored after the warm-up
    assert "before: step 2, after model.head_warmup_steps=2" in capsys.readouterr().out
    card = (export / "README.md").read_text(encoding="utf-8")
    assert "before (step 2, after a head warm-up" in card


def test_a_head_warm_up_as_long_as_the_run_is_refused(tmp_path, corpus_file, capsys):
    args = tiny_fit_args(family_dir("bert"), corpus_file, tmp_path, "--trainer.max_steps=2")
    with pytest.raises(SystemExit):
        main(["fit", *args, "--model.head_warmup_steps=2"])
    assert "model.head_warmup_steps=2 leaves no step to train the whole model" in capsys.readouterr().err
