"""Export to a Hugging Face directory: the fit-end callback, the ``export`` command, the Hub push boundary."""

from __future__ import annotations

import re
from fnmatch import fnmatch
from pathlib import Path
from types import SimpleNamespace

import httpx2
import pytest
import torch
from conftest import make_datamodule, quiet_trainer
from huggingface_hub import HfApi, ModelCard, RepoUrl, constants
from huggingface_hub.errors import HfHubHTTPError
from lightning.fabric.strategies.fsdp import _distributed_checkpoint_save
from lightning.fabric.utilities.load import _METADATA_FILENAME
from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

from mlm_adapt.cli import main
from mlm_adapt.cli.commands import export_main
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.export import HFExport
from mlm_adapt.export.options import COMMIT_MESSAGE
from mlm_adapt.export.writer import verify_export
from mlm_adapt.guard.outputs import MARKER

PROBE = ["北京[MASK][MASK]你！", "这本书的内容很好，值得一读。"]
FILES = {
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "training_config.yaml",
    "README.md",
}
EXPORTED = FILES | {MARKER}  # the marker that lets overwrite recognise an earlier export


def export(**options) -> None:
    """``python -m mlm_adapt export`` in-process (it prints like the command)."""
    args = [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in options.items()]
    export_main(args)


def best_checkpoint(root: Path) -> Path:
    (best,) = [p for p in (root / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt"]
    return best


def checkpoint_logits(ckpt: Path, base_dir: Path, tokenizer) -> torch.Tensor:
    """Logits of the checkpoint's weights, loaded independently of mlm_adapt's code."""
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    model = AutoModelForMaskedLM.from_pretrained(base_dir).eval()
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    with torch.no_grad():
        return model(**tokenizer(PROBE, padding=True, return_tensors="pt")).logits


def export_logits(directory: Path) -> torch.Tensor:
    model = AutoModelForMaskedLM.from_pretrained(directory).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    with torch.no_grad():
        return model(**tokenizer(PROBE, padding=True, return_tensors="pt")).logits


def card_table(card_path: Path) -> dict[str, tuple[str, str]]:
    rows = re.findall(r"^\| (val/\w+) \| ([^|]+) \| ([^|]+) \|$", card_path.read_text(encoding="utf-8"), re.M)
    return {name: (before.strip(), after.strip()) for name, before, after in rows}


@pytest.mark.slow
def test_fit_exports_best_checkpoint_with_identical_logits(trained_run, tiny_model_dir, tokenizer):
    export_dir = trained_run / "export"
    assert {p.name for p in export_dir.iterdir()} == EXPORTED
    best = best_checkpoint(trained_run)
    card = (export_dir / "README.md").read_text(encoding="utf-8")
    step = int(best.stem.rsplit("step=", 1)[1])
    # best, not last; by its file name and step, not its path
    assert f"best checkpoint by val/loss: {best.name} (step {step})" in card and str(trained_run) not in card
    assert torch.equal(export_logits(export_dir), checkpoint_logits(best, tiny_model_dir, tokenizer))
    assert "mlm_adapt export: wrote" in (trained_run / "fit_stderr.txt").read_text(encoding="utf-8")


@pytest.mark.slow
def test_pipeline_fill_mask_loads_the_export(trained_run):
    fill = pipeline("fill-mask", model=str(trained_run / "export"))
    predictions = fill("北京[MASK]你！", top_k=4)
    assert len(predictions) == 4
    scores = [p["score"] for p in predictions]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1
    assert all(p["sequence"].replace(" ", "").startswith("北京") for p in predictions)


@pytest.mark.slow
def test_model_card_metadata_and_before_after_metrics(trained_run):
    card_path = trained_run / "export" / "README.md"
    card = ModelCard.load(card_path)
    assert card.data.language == "zh" and card.data.pipeline_tag == "fill-mask"
    assert card.data.library_name == "transformers" and card.data.license == "apache-2.0"
    assert "whole-word-masking" in card.data.tags
    checkpoint = torch.load(best_checkpoint(trained_run), map_location="cpu", weights_only=False)
    baseline = checkpoint["mlm_adapt_baseline_metrics"]
    (best_score,) = [
        s["best_model_score"] for k, s in checkpoint["callbacks"].items() if "ModelCheckpoint" in k
    ]
    table = card_table(card_path)
    assert set(table) == {"val/loss", "val/accuracy", "val/word_accuracy", "val/perplexity"}
    assert table["val/word_accuracy"][0] == f"{baseline['val/word_accuracy']:.4f}"
    assert table["val/loss"] == (f"{baseline['val/loss']:.4f}", f"{float(best_score):.4f}")
    assert table["val/perplexity"][0] == f"{baseline['val/perplexity']:.4f}"
    text = card_path.read_text(encoding="utf-8")
    assert f"after (step {checkpoint['global_step']})" in text
    assert "- segmenter: `rjieba`" in text and "- mlm_probability: 0.15" in text
    assert re.search(r"- train documents: [\d,]+", text) and "reviews.txt" in text
    config = (trained_run / "export" / "training_config.yaml").read_text(encoding="utf-8")
    assert "model_name_or_path:" in config and "export:" in config


@pytest.mark.slow
def test_export_command_from_checkpoint_and_overwrite_refusal(trained_run, tmp_path, capsys):
    out = tmp_path / "exported"
    main(["export", f"--ckpt_path={best_checkpoint(trained_run)}", f"--output_dir={out}"])
    assert "reload check: AutoModelForMaskedLM logits match the checkpoint" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == EXPORTED
    assert card_table(out / "README.md") == card_table(trained_run / "export" / "README.md")
    assert torch.equal(export_logits(out), export_logits(trained_run / "export"))

    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    with pytest.raises(SystemExit) as exit_info:
        main(["export", f"--ckpt_path={trained_run / 'checkpoints' / 'last.ckpt'}", f"--output_dir={out}"])
    assert exit_info.value.code == 2
    assert "is not empty" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before

    overwrite = [
        "export",
        f"--ckpt_path={trained_run / 'checkpoints' / 'last.ckpt'}",
        f"--output_dir={out}",
        "--overwrite",
    ]
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(SystemExit):
        main(overwrite)  # overwrite replaces only what an export wrote
    assert "holds notes.txt, which no export wrote" in capsys.readouterr().err
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine"

    (out / "notes.txt").unlink()
    main(overwrite)
    assert {p.name for p in out.iterdir()} == EXPORTED
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported"]  # no staging or backup left


@pytest.mark.slow
def test_export_consolidates_fsdp_sharded_checkpoint(trained_run, tmp_path):
    # Lay the checkpoint out exactly as FSDPStrategy.save_checkpoint(state_dict_type="sharded") does
    # (the trainer's FSDP needs a GPU): weights through torch.distributed.checkpoint, the rest in meta.pt.
    checkpoint = torch.load(best_checkpoint(trained_run), map_location="cpu", weights_only=False)
    sharded = tmp_path / "epoch=0-step=6.ckpt"
    checkpoint.pop("optimizer_states")  # FSDP keys them by parameter name; export never reads them
    _distributed_checkpoint_save({"model": checkpoint.pop("state_dict")}, sharded)
    torch.save(checkpoint, sharded / _METADATA_FILENAME)
    export(ckpt_path=str(sharded), output_dir=str(tmp_path / "from_fsdp"))
    assert torch.equal(export_logits(tmp_path / "from_fsdp"), export_logits(trained_run / "export"))
    assert card_table(tmp_path / "from_fsdp" / "README.md") == card_table(
        trained_run / "export" / "README.md"
    )


@pytest.mark.slow
def test_reload_check_fails_loudly_on_different_weights(trained_run, tokenizer):
    model = AutoModelForMaskedLM.from_pretrained(trained_run / "export")
    with torch.no_grad():
        model.cls.predictions.transform.dense.weight.mul_(1.05)
    with pytest.raises(MLMAdaptError, match="export check failed: logits"):
        verify_export(model, tokenizer, trained_run / "export")


class HubRecorder:
    """Stands in for the network behind ``HfApi``: records calls and the folder's files at upload time."""

    def __init__(self, monkeypatch, fail_upload: int | None = None):
        self.calls: list[tuple[str, dict]] = []
        self.uploaded: set[str] = set()
        recorder = self

        def create_repo(api, repo_id, **kwargs):
            recorder.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
            return RepoUrl(f"https://huggingface.co/{repo_id}")

        def create_branch(api, repo_id, **kwargs):
            recorder.calls.append(("create_branch", {"repo_id": repo_id, **kwargs}))

        def upload_folder(api, **kwargs):
            recorder.calls.append(("upload_folder", kwargs))
            ignored = kwargs.get("ignore_patterns") or []
            names = [p.name for p in Path(kwargs["folder_path"]).iterdir()]
            recorder.uploaded = {n for n in names if not any(fnmatch(n, i) for i in ignored)}
            if fail_upload:
                request = httpx2.Request("POST", "https://huggingface.co/api/models/x/commit/main")
                raise HfHubHTTPError("Unauthorized", response=httpx2.Response(fail_upload, request=request))
            return SimpleNamespace(commit_url=f"https://huggingface.co/{kwargs['repo_id']}/commit/abc")

        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "create_branch", create_branch)
        monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_TOKEN", "hf_secret_value_never_printed")


@pytest.mark.slow
def test_export_push_to_hub_arguments(trained_run, tmp_path, monkeypatch, capsys):
    hub = HubRecorder(monkeypatch)
    out = tmp_path / "pushed"
    export(
        ckpt_path=str(best_checkpoint(trained_run)),
        output_dir=str(out),
        push_to_hub=True,
        repo_id="someone/tiny-zh-reviews",
        private=True,
        revision="adapted",
    )
    assert hub.calls == [
        (
            "create_repo",
            {"repo_id": "someone/tiny-zh-reviews", "private": True, "repo_type": "model", "exist_ok": True},
        ),
        (
            "create_branch",
            {
                "repo_id": "someone/tiny-zh-reviews",
                "branch": "adapted",
                "repo_type": "model",
                "exist_ok": True,
            },
        ),
        (
            "upload_folder",
            {
                "repo_id": "someone/tiny-zh-reviews",
                "folder_path": str(out),
                "repo_type": "model",
                "revision": "adapted",
                "commit_message": COMMIT_MESSAGE,
                "ignore_patterns": [MARKER],
            },
        ),
    ]
    assert hub.uploaded == FILES
    # The card pushed to a branch loads that branch.
    usage = 'pipeline("fill-mask", model="someone/tiny-zh-reviews", revision="adapted")'
    assert usage in (out / "README.md").read_text("utf-8")
    captured = capsys.readouterr()
    assert "pushed to https://huggingface.co/someone/tiny-zh-reviews/commit/abc" in captured.out
    assert "hf_secret_value" not in captured.out + captured.err


@pytest.mark.slow
def test_push_unauthorized_keeps_local_export(trained_run, tmp_path, monkeypatch, capsys):
    hub = HubRecorder(monkeypatch, fail_upload=401)
    out = tmp_path / "kept"
    with pytest.raises(MLMAdaptError, match=r"HTTP 401.*local export is kept in") as error:
        export(
            ckpt_path=str(best_checkpoint(trained_run)), output_dir=str(out), push_to_hub=True, repo_id="x/y"
        )
    assert "hf_secret_value" not in str(error.value) + capsys.readouterr().out
    assert hub.uploaded == FILES and {p.name for p in out.iterdir()} == EXPORTED


@pytest.mark.slow
def test_push_refused_before_any_work_when_offline_or_logged_out(trained_run, tmp_path, monkeypatch):
    ckpt = str(best_checkpoint(trained_run))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(MLMAdaptError, match="HF_HUB_OFFLINE is set"):
        export(ckpt_path=ckpt, output_dir=str(tmp_path / "a"), push_to_hub=True, repo_id="x/y")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no_token"))
    with pytest.raises(MLMAdaptError, match="no Hugging Face token; set HF_TOKEN or run `hf auth login`"):
        export(ckpt_path=ckpt, output_dir=str(tmp_path / "a"), push_to_hub=True, repo_id="x/y")
    with pytest.raises(MLMAdaptError, match="export.repo_id is required"):
        HFExport(push_to_hub=True)
    assert not (tmp_path / "a").exists()


def test_callback_in_plain_trainer_exports_last_and_pushes(
    tiny_model_dir, corpus_file, tmp_path, monkeypatch
):

    from mlm_adapt.model import MaskedLMModule

    hub = HubRecorder(monkeypatch)
    out = tmp_path / "last_export"
    callback = HFExport(
        output_dir=str(out), checkpoint="last", push_to_hub=True, repo_id="me/last", license="mit"
    )
    trainer = quiet_trainer(max_steps=2, limit_val_batches=1, default_root_dir=tmp_path, callbacks=[callback])
    module = MaskedLMModule(str(tiny_model_dir), max_seq_length=64)
    datamodule = make_datamodule(tiny_model_dir, corpus_file, tmp_path, validation_split=0.1)
    trainer.fit(module, datamodule)
    module.model.eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        expected = module.model(**tokenizer(PROBE, padding=True, return_tensors="pt")).logits
    assert torch.equal(export_logits(out), expected)
    assert [name for name, _ in hub.calls] == ["create_repo", "upload_folder"]  # no revision: no branch
    card = ModelCard.load(out / "README.md")
    assert card.data.license == "mit" and "final weights of the run" in card.text
    # Without LightningCLI the hyperparameters stand in for the resolved config.
    assert "no LightningCLI config recorded" in (out / "training_config.yaml").read_text(encoding="utf-8")


def test_callback_refuses_non_empty_output_dir_before_training(tmp_path):
    import lightning as L

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.safetensors").write_bytes(b"previous")
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    with pytest.raises(MLMAdaptError, match=r"export.output_dir: .*out is not empty"):
        HFExport(output_dir=str(tmp_path / "out")).setup(trainer, L.LightningModule(), "fit")
    with pytest.raises(MLMAdaptError, match=r"export.output_dir: .*out is not an mlm_adapt export"):
        HFExport(output_dir=str(tmp_path / "out"), overwrite=True).setup(trainer, L.LightningModule(), "fit")
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == b"previous"  # never deleted
