"""Model sizes and model directories checked before allocation: absurd configs of several families are
refused in one line, fast and without memory; weights that disagree with ``config.json`` are named."""

from __future__ import annotations

import json
import resource
import shutil
import time
from pathlib import Path

import pytest
import torch
from families import family_dir
from transformers import AutoConfig, AutoModelForMaskedLM, BertConfig, BertForMaskedLM

import mlm_adapt.model.loading as model_size_module
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.model.loading import (
    check_fits,
    check_trainer_fits,
    load_masked_lm,
    meta_masked_lm,
    model_size,
    pretrained_masked_lm,
)

KEY = "model.model_name_or_path"
# Each needs terabytes: refused on any machine, whether the whole training state or only the load counts.
ABSURD = {
    "vocab": {"vocab_size": 1_000_000_000, "hidden_size": 768, "intermediate_size": 3072},
    "width": {"hidden_size": 65_536, "num_attention_heads": 64, "intermediate_size": 262_144},
    "depth": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_attention_heads": 12,
        "num_hidden_layers": 100_000,
    },
}
FAMILIES = ("bert", "modernbert", "deberta")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def _edit_config(directory: Path, **changes) -> Path:
    path = directory / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.update(changes)
    if "num_hidden_layers" in changes and "layer_types" in config:  # ModernBERT lists one type a layer
        config["layer_types"] = (config["layer_types"] * changes["num_hidden_layers"])[
            : changes["num_hidden_layers"]
        ]
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


@pytest.fixture(params=FAMILIES)
def family_copy(request, tmp_path) -> Path:
    """A tiny model of the family in a directory of the test's own (its config.json gets edited)."""
    return Path(shutil.copytree(family_dir(request.param), tmp_path / request.param))


@pytest.mark.parametrize("case", list(ABSURD), ids=list(ABSURD))
@pytest.mark.parametrize("pretrained", [False, True], ids=["random_init", "pretrained"])
def test_an_absurd_config_is_refused_in_one_line_before_allocation(case, pretrained, family_copy):
    config_path = _edit_config(family_copy, **ABSURD[case])
    load_masked_lm(str(family_dir("bert")), pretrained=False)  # the imports and first build, not measured
    rss, started = _peak_rss_mb(), time.monotonic()
    with pytest.raises(MLMAdaptError) as info:
        load_masked_lm(str(family_copy), pretrained=pretrained)
    seconds, grown = time.monotonic() - started, _peak_rss_mb() - rss
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{KEY}: ")
    if pretrained and case != "depth":  # the weights' shapes disagree with the edited config first
        assert f"{family_copy / 'model.safetensors'} and {config_path} disagree: tensor" in message
    elif pretrained:  # deeper than the exact count builds: the size is refused before any shape is read
        assert f"{config_path} describes" in message
    else:
        assert f"{config_path} describes" in message and " B parameters (vocab_size " in message
        assert "needs ~" in message and "GB available" in message
    assert seconds < 10 and grown < 500, (seconds, grown)


def test_the_message_names_the_sizes_the_bytes_and_the_fix(tmp_path):
    directory = tmp_path / "big"
    BertForMaskedLM(
        BertConfig(
            vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
        )
    ).save_pretrained(directory)
    _edit_config(directory, vocab_size=50_000_000, hidden_size=768, intermediate_size=3072)
    with pytest.raises(MLMAdaptError) as info:
        load_masked_lm(str(directory), pretrained=False)
    message = str(info.value)
    assert message.startswith(
        f"{KEY}: {directory / 'config.json'} describes 38.46 B parameters "
        "(vocab_size 50000000, hidden_size 768, num_hidden_layers 1, intermediate_size 3072); "
    )
    assert "lower these sizes in the config" in message


@pytest.mark.parametrize("family", ["bert", "electra", "xlmr", "albert", "deberta", "modernbert"])
def test_the_count_is_exact_for_every_family(family, monkeypatch):
    directory = family_dir(family)
    config = AutoConfig.from_pretrained(directory)
    loaded = AutoModelForMaskedLM.from_pretrained(directory)
    assert model_size(config).parameters == sum(p.numel() for p in loaded.parameters())
    # Deeper than an exact build: counted from 2 and 3 layers (the first may differ, the rest repeat).
    config.num_hidden_layers = 5
    if getattr(config, "layer_types", None):
        config.layer_types = (config.layer_types * 5)[:5]
    exact = sum(p.numel() for p in AutoModelForMaskedLM.from_config(config).parameters())
    monkeypatch.setattr(model_size_module, "EXACT_DEPTH", 1)
    counted = model_size(config)
    assert counted.model is None and counted.parameters == exact


def test_a_tiny_model_still_loads(tiny_model_dir):
    model, head = load_masked_lm(str(tiny_model_dir))
    assert isinstance(model, BertForMaskedLM) and model.device.type == "cpu" and head == "trained"
    random, head = load_masked_lm(str(tiny_model_dir), pretrained=False)
    assert random.config.vocab_size == model.config.vocab_size and head is None


def test_too_little_memory_refuses_even_a_tiny_model(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(model_size_module, "available_memory", lambda device="cpu": 1000)
    with pytest.raises(MLMAdaptError, match=r"needs ~0\.\d GB.*this machine has 0\.0 GB available"):
        load_masked_lm(str(tiny_model_dir))


@pytest.mark.parametrize("change", [{"vocab_size": 1234}, {"hidden_size": 48}, {"intermediate_size": 96}])
def test_weights_that_disagree_with_config_json_are_named(change, tiny_model_dir, tmp_path):
    directory = tmp_path / "edited"
    AutoModelForMaskedLM.from_pretrained(tiny_model_dir).save_pretrained(directory)
    config_path = _edit_config(directory, **change)
    with pytest.raises(MLMAdaptError) as info:
        pretrained_masked_lm(str(directory), KEY)
    message = str(info.value)
    weights = directory / "model.safetensors"
    assert "\n" not in message
    assert message.startswith(f"{KEY}: {weights} and {config_path} disagree: tensor '")
    assert "in the weights but [" in message and "by the config (" in message
    assert "without a counterpart in the model" in message


def test_a_pytorch_model_bin_is_compared_too_with_legacy_names(tiny_model_dir, tmp_path):
    directory = tmp_path / "bin"
    model = AutoModelForMaskedLM.from_pretrained(tiny_model_dir)
    model.config.save_pretrained(directory)
    # An old checkpoint: the base model without the ``bert.`` prefix, LayerNorm as gamma/beta.
    state = {
        k.removeprefix("bert.")
        .replace("LayerNorm.weight", "LayerNorm.gamma")
        .replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in model.state_dict().items()
    }
    torch.save(state, directory / "pytorch_model.bin")
    config_path = _edit_config(directory, hidden_size=48)
    with pytest.raises(MLMAdaptError) as info:
        pretrained_masked_lm(str(directory), KEY)
    message = str(info.value)
    assert f"{directory / 'pytorch_model.bin'} and {config_path} disagree" in message
    assert "tensor 'bert.embeddings.word_embeddings.weight' is [" in message
    assert ", 32] in the weights but [" in message and ", 48] by the config" in message


def test_a_config_transformers_cannot_build_is_one_line(tiny_model_dir, tmp_path):
    directory = tmp_path / "heads"
    AutoModelForMaskedLM.from_pretrained(tiny_model_dir).save_pretrained(directory)
    _edit_config(directory, num_attention_heads=5)  # 32 is no multiple of 5
    with pytest.raises(MLMAdaptError, match="describes no model transformers can build"):
        load_masked_lm(str(directory), pretrained=False)


# ---------------------------------------------------------------- the trainer's device


def _bert_base_on_meta():
    return meta_masked_lm(BertConfig(vocab_size=21_128))  # 102 M parameters: ~1.6 GB to train in float32


def test_a_gpu_with_too_little_free_memory_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (500_000_000, 80_000_000_000))
    model = _bert_base_on_meta()
    with pytest.raises(MLMAdaptError) as info:
        check_trainer_fits(model, "hfl/x", KEY, torch.device("cuda", 0), "32-true", training=True)
    message = str(info.value)
    assert message.startswith(f"{KEY}: 'hfl/x' (its config.json) describes 0.10 B parameters")
    assert "training them in float32 needs ~1.6 GB" in message and "GPU 0 has 0.5 GB available" in message
    # Half the bytes in bf16-true; only the parameters to evaluate.
    check_trainer_fits(model, "hfl/x", KEY, torch.device("cuda", 0), "bf16-true", training=False)
    with pytest.raises(MLMAdaptError, match="training them in 16-bit needs ~0.8 GB"):
        check_trainer_fits(model, "hfl/x", KEY, torch.device("cuda", 0), "bf16-true", training=True)


def test_on_cpu_the_loaded_parameters_are_not_counted_twice(monkeypatch):
    model = _bert_base_on_meta()
    params = sum(p.numel() for p in model.parameters()) * 4
    monkeypatch.setattr(model_size_module, "available_memory", lambda device="cpu": 3 * params)
    check_trainer_fits(model, "m", KEY, torch.device("cpu"), "32-true", training=True)
    monkeypatch.setattr(model_size_module, "available_memory", lambda device="cpu": 3 * params - 1)
    with pytest.raises(MLMAdaptError, match="this machine has"):
        check_trainer_fits(model, "m", KEY, torch.device("cpu"), "32-true", training=True)


def test_unknown_free_memory_refuses_nothing():
    size = model_size(BertConfig(vocab_size=1_000_000_000))
    check_fits(BertConfig(), size, "config.json", KEY, training=True, device="meta")
