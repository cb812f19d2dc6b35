"""Prepare once, train anywhere: ``prepare`` then ``fit``/``validate``/``preview`` with the corpus gone,
exact resume and a 2-process DDP fit from a prepared directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli, tiny_fit_args
from recorder import assert_kill_and_resume_reproduces, read_records, recorded_fit_args

from mlm_adapt.cli.commands import main


def _prepared(model_dir: Path, corpus: Path, root: Path) -> tuple[Path, list[str]]:
    """Prepares ``corpus`` into ``root/prepared`` in-process; returns it and the fit arguments that use it."""
    target = root / "prepared"
    args = tiny_fit_args(model_dir, corpus, root)
    main(["prepare", *args, f"--data.prepared_dir={target}"])
    return target, [*args, f"--data.prepared_dir={target}"]


def _phase_lines(messages: list[str], command: str) -> list[str]:
    return [
        m.split(": ", 1)[1].rsplit(" done in ", 1)[0]
        for m in messages
        if m.startswith(f"mlm_adapt {command}: ") and " done in " in m
    ]


def test_fit_validate_preview_export_from_a_prepared_dir_with_the_corpus_deleted(
    tiny_model_dir, corpus_file, tmp_path, capsys, caplog, monkeypatch
):
    target, args = _prepared(tiny_model_dir, corpus_file, tmp_path)
    corpus_file.unlink()
    caplog.clear()
    main(["fit", *args, f"--export.output_dir={tmp_path / 'export'}"])
    checkpoints = list(tmp_path.glob("lightning_logs/version_0/checkpoints/*.ckpt"))
    assert len(checkpoints) == 1 and (tmp_path / "export" / "model.safetensors").is_file()
    # --trainer.enable_progress_bar=false: the export logs its phases with their durations.
    assert _phase_lines(caplog.messages, "export") == [
        "saving the weights (safetensors)",
        "saving the tokenizer, config and model card",
        "reloading the export to compare logits",
        f"publishing {tmp_path / 'export'}",
    ]
    # Nothing was written into the prepared directory (it may be read-only and shared by every node).
    manifest = json.loads((target / "manifest.json").read_text())
    listed = {s["file"] for split in manifest["splits"].values() for s in split["shards"]}
    assert {p.name for p in target.iterdir()} == listed | {"manifest.json"}

    main(["validate", *args, f"--ckpt_path={checkpoints[0]}"])
    capsys.readouterr()
    main(["preview", *args, "--num_examples=2", "--format=json"])
    examples = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(examples) == 2 and all(e["tokens"][0] == "[CLS]" and e["labels"] for e in examples)

    # The export command, with a (faked) Hub upload: phase lines without bars, a bar with them.
    import mlm_adapt.export.callback as export_callback
    import mlm_adapt.export.options as export_options

    monkeypatch.setattr(export_callback, "check_hub_access", lambda repo_id: None)
    monkeypatch.setattr(export_options, "push_folder", lambda *a, **k: "https://hub/commit/1")
    caplog.clear()
    out = tmp_path / "exported"
    push = ["--push_to_hub", "--repo_id=me/model"]
    main(["export", f"--ckpt_path={checkpoints[0]}", f"--output_dir={out}", "--progress_bar=false", *push])
    phases = _phase_lines(caplog.messages, "export")
    assert phases[0] == f"loading {checkpoints[0]}" and phases[-1] == "uploading to the Hub (me/model)"
    assert "%|" not in capsys.readouterr().err
    main(["export", f"--ckpt_path={checkpoints[0]}", f"--output_dir={tmp_path / 'bar'}", *push])
    assert "Exporting to bar" in capsys.readouterr().err


STEPS, KILL_AT = 8, 4


def _fit(args: list[str], root: Path, *extra: str):
    return run_cli(
        "fit", *args, f"--trainer.default_root_dir={root}", *recorded_fit_args(root, STEPS, KILL_AT), *extra
    )


@pytest.mark.slow
def test_exact_resume_from_a_prepared_dir(tiny_model_dir, corpus_file, tmp_path):
    _, args = _prepared(tiny_model_dir, corpus_file, tmp_path)
    corpus_file.unlink()
    assert_kill_and_resume_reproduces(lambda root, *extra: _fit(args, root, *extra), tmp_path, STEPS, KILL_AT)


@pytest.mark.slow
def test_ddp_from_a_prepared_dir_gives_ranks_disjoint_examples(tiny_model_dir, corpus_file, tmp_path):
    _, args = _prepared(tiny_model_dir, corpus_file, tmp_path)
    corpus_file.unlink()
    rec, steps = tmp_path / "rec", 3
    result = run_cli(
        "fit",
        *args,
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
        f"--trainer.max_steps={steps}",
        "--trainer.callbacks+=tests.recorder.BatchRecorder",
        f"--trainer.callbacks.out_dir={rec}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ids = [[i for r in read_records(rec, rank) for i in r["ids"]] for rank in (0, 1)]
    assert [len(i) for i in ids] == [steps * 8] * 2
    assert not set(ids[0]) & set(ids[1]), "the two ranks trained on the same examples"
    assert "Segmenting" not in result.stderr  # no rank tokenized anything


def test_prepare_shard_through_the_cli_writes_its_part_into_the_parts_home(
    tiny_model_dir, corpus_file, tmp_path
):
    """With --shard, data.prepared_dir is the parts' home: prepare's output, never one of its inputs."""
    home = tmp_path / "parts"
    args = tiny_fit_args(tiny_model_dir, corpus_file, tmp_path)
    main(["prepare", *args, f"--data.prepared_dir={home}", "--shard=0/1"])
    assert (home / "part-00000-of-00001" / "manifest.json").is_file()
    assert not [p.name for p in home.iterdir() if p.name.startswith(".")]  # no staging, no lock left
