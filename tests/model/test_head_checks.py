"""The masked-LM head is checked at load, for every family the tests build: a full checkpoint loads
silently, an encoder-only one is said in one line and trains, a partial head or an untied decoder is
refused in one line."""

from __future__ import annotations

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
from mlm_adapt.model.loading import HEAD_PARTIAL, HEAD_TRAINED, HEAD_UNTRAINED, check_head, load_masked_lm


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
