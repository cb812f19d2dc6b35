"""The command line answers at once: the usage names every command, and ``--help`` of each command (and a
refused corpus file) imports only what that command needs, checked in a fresh interpreter per command."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

from mlm_adapt.cli import help_cache, main
from mlm_adapt.cli.usage import SUMMARIES, TRAINER_COMMANDS

HEAVY = ("torch", "lightning", "transformers", "datasets", "pandas")
TRAINER_STACK = {"torch", "lightning", "transformers", "datasets", "pandas"}  # pandas: with datasets
# Command -> the heavy modules its --help may import: LightningCLI's parser (fit, validate, test) needs the
# Trainer's, the model's and the data module's signatures; every other command none.
HELP_IMPORTS = {name: TRAINER_STACK if name in TRAINER_COMMANDS else set() for name in SUMMARIES}
# Prints, after the command, which heavy modules it imported.
CODE = """
import sys
from mlm_adapt.cli import main
try:
    main()
finally:
    print("imported:", ",".join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)
"""


def run_fresh(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``python -m mlm_adapt ARGS`` in a new interpreter; its result and the heavy modules it imported."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", CODE.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    line = [x for x in result.stderr.splitlines() if x.startswith("imported:")][-1]
    return result, {m for m in line.removeprefix("imported:").strip().split(",") if m}


@pytest.mark.parametrize("command", [*(name for name in SUMMARIES if name not in TRAINER_COMMANDS), ""])
def test_help_imports_only_what_the_command_needs(command, tmp_path, monkeypatch):
    monkeypatch.setenv("MLM_ADAPT_HELP_CACHE", str(tmp_path / "help"))
    result, imported = run_fresh(*([command] if command else []), "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert imported == HELP_IMPORTS.get(command, set()), f"{command} --help imported {sorted(imported)}"
    assert "usage:" in result.stdout


@pytest.mark.parametrize("command", list(TRAINER_COMMANDS))
def test_a_trainer_commands_help_built_once_answers_without_the_stack(command, tmp_path, monkeypatch):
    monkeypatch.setenv("MLM_ADAPT_HELP_CACHE", str(tmp_path / "help"))  # empty: the first help is built
    built, imported = run_fresh(command, "--help")
    assert built.returncode == 0, built.stderr[-2000:]
    assert imported == HELP_IMPORTS[command], f"{command} --help imported {sorted(imported)}"
    assert "usage:" in built.stdout
    again, imported = run_fresh(command, "-h")
    assert again.returncode == 0 and imported == set(), again.stderr[-2000:]
    assert again.stdout == built.stdout and "--trainer.max_steps" in again.stdout
    assert len(list((tmp_path / "help").iterdir())) == 1
    # With a config the help shows its values as defaults: never from the cache. cacheable() decides it
    # alike for every command; a fresh interpreter shows it once, for fit.
    config = ["--config", str(REPO / "configs" / "demo.yaml"), "--help"]
    assert not help_cache.cacheable([command, *config], TRAINER_COMMANDS)
    if command == "fit":
        with_config, imported = run_fresh(command, *config)
        assert with_config.returncode == 0 and imported == TRAINER_STACK


def test_the_help_cache_key_follows_the_code_and_the_terminal(monkeypatch, tmp_path):
    key = help_cache.help_key("fit")
    assert help_cache.help_key("fit") == key and help_cache.help_key("test") != key
    monkeypatch.setenv("COLUMNS", "57")
    assert help_cache.help_key("fit") != key  # formatted for another width
    monkeypatch.delenv("COLUMNS")
    copy = tmp_path / "mlm_adapt"
    import shutil

    shutil.copytree(help_cache.PACKAGE, copy)
    monkeypatch.setattr(help_cache, "PACKAGE", copy)
    assert help_cache.help_key("fit") == key
    (copy / "data" / "datamodule.py").write_text("# an edited option docstring\n", encoding="utf-8")
    assert help_cache.help_key("fit") != key
    versions = help_cache.metadata.version
    monkeypatch.setattr(help_cache.metadata, "version", lambda name: versions(name) + "-other")
    assert help_cache.help_key("fit") != key


def test_the_help_cache_is_where_its_setting_says_and_none_when_it_is_empty(monkeypatch, tmp_path):
    monkeypatch.setenv("MLM_ADAPT_HELP_CACHE", str(tmp_path / "help"))
    assert help_cache.cache_dir() == tmp_path / "help"
    monkeypatch.setenv("MLM_ADAPT_HELP_CACHE", "")
    assert help_cache.cache_dir() is None


@pytest.mark.parametrize("command", ["preview", "prepare", "vocab"])
def test_missing_corpus_file_is_refused_before_the_stack(command, tmp_path):
    missing = tmp_path / "nope.txt"
    output = [f"--data.prepared_dir={tmp_path / 'prepared'}"] if command == "prepare" else []
    result, imported = run_fresh(command, f"--data.train_files=[{missing}]", *output)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("mlm_adapt: error:")]
    assert errors == [
        f"mlm_adapt: error: data.train_files: '{missing}' matches no file; check the path or glob"
    ]
    assert "Traceback" not in result.stderr and imported == set()


def test_missing_corpus_file_in_a_config_is_refused_before_the_stack(tmp_path):
    config = tmp_path / "fit.yaml"
    config.write_text(f"data:\n  train_files: [{tmp_path / 'gone.txt'}]\n", encoding="utf-8")
    result, imported = run_fresh("vocab", "--config", str(config))
    assert result.returncode == 2 and "gone.txt' matches no file" in result.stderr, result.stderr[-2000:]
    assert imported == set()


def test_no_command_prints_the_usage_with_every_command(capsys):
    with pytest.raises(SystemExit) as stopped:
        main([])
    assert stopped.value.code == 0
    text = capsys.readouterr().out
    usage_line = text.splitlines()[0]
    assert usage_line == "usage: python -m mlm_adapt [--debug] {" + ",".join(SUMMARIES) + "} ..."
    for name, summary in SUMMARIES.items():
        assert f"  {name}" in text and summary in text


def test_corpus_check_leaves_what_it_cannot_tell_to_the_parser(tmp_path):
    from mlm_adapt.cli.data_only import corpus_settings

    files = f"--data.train_files=[{tmp_path}/a.txt]"
    assert corpus_settings([files])["train_files"] == [f"{tmp_path}/a.txt"]
    assert corpus_settings([files, "--data.dataset_name", "x"])["dataset_name"] == "x"
    assert corpus_settings([files, "--data", "data.yaml"]) is None
    assert corpus_settings([files, "--data.train_files+=b.txt"]) is None
    assert corpus_settings([files, "--print_config"]) is None
    assert corpus_settings(["--config", str(tmp_path / "absent.yaml")]) is None
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  dataset_name: hub/set\n", encoding="utf-8")
    later = corpus_settings([files, "--config", str(config)])
    assert later["dataset_name"] == "hub/set" and later["train_files"] == [f"{tmp_path}/a.txt"]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["fit", "--config", "{gone}/fit.yaml"],
            "Parser key \"config\": File does not exist: '{gone}/fit.yaml' "
            "(python -m mlm_adapt fit --help for usage)",
        ),
        (
            ["test", "-c={gone}/fit.yaml"],
            "Parser key \"config\": File does not exist: '{gone}/fit.yaml' "
            "(python -m mlm_adapt test --help for usage)",
        ),
        (
            ["export", "--ckpt_path", "{gone}/last.ckpt", "--output_dir", "{gone}/out"],
            "--ckpt_path: {gone}/last.ckpt does not exist; give a .ckpt file the trainer wrote",
        ),
        (
            ["fill-mask", "北京[MASK]你", "--model", "{gone}/model"],
            "--model: {gone}/model does not exist; check the path (a save_pretrained directory)",
        ),
    ],
    ids=["fit-config", "test-config", "export-ckpt", "fill-mask-model"],
)
def test_a_missing_file_of_the_other_commands_is_refused_before_the_stack(args, line, tmp_path):
    gone = tmp_path / "gone"
    result, imported = run_fresh(*(a.format(gone=gone) for a in args))
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [x for x in result.stderr.splitlines() if x.startswith("mlm_adapt: error:")]
    assert errors == ["mlm_adapt: error: " + line.format(gone=gone)]
    assert imported == set()
