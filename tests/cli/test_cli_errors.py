"""Crashes and messages at the CLI: each bad input or fault is one line (or simply works)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO, run_cli, tiny_fit_args

from mlm_adapt.cli import main


def fails_with(args: list[str], capsys, code: int = 2) -> str:
    """Runs the CLI in-process; the one ``mlm_adapt: error:`` line it printed (and no traceback)."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == code, err[-20:]
    message = [line for line in err if line.startswith("mlm_adapt: error:")]
    assert len(message) == 1 and not any("Traceback" in line for line in err), err[-20:]
    return message[0]


@pytest.fixture
def data_args(tiny_model_dir, corpus_file, tmp_path):
    """``--model.*``/``--data.*`` arguments of a tiny run (what preview takes), plus extra ones."""

    def make(*extra: str) -> list[str]:
        args = tiny_fit_args(tiny_model_dir, corpus_file, tmp_path, *extra)
        return [a for a in args if a.startswith(("--model", "--data"))]

    return make


def test_preview_negative_num_examples_is_refused(data_args, capsys):
    message = fails_with(["preview", *data_args(), "--num_examples", "-1"], capsys)
    assert "--num_examples=-1" in message


def test_fill_mask_text_longer_than_the_model_positions(tiny_model_dir, capsys):
    text = "好" * 300 + "[MASK]"  # the tiny model takes 128 positions
    message = fails_with(["fill-mask", text, "--model", str(tiny_model_dir)], capsys)
    assert "303 tokens" in message and "128" in message


def test_missing_local_model_path_does_not_talk_about_the_hub(tmp_path, capsys):
    missing = tmp_path / "no" / "such-model"
    message = fails_with(["fill-mask", "好[MASK]", "--model", str(missing)], capsys)
    assert "does not exist" in message and str(missing) in message
    assert "repo" not in message.lower() and "hub" not in message.lower()


@pytest.mark.parametrize("command", ["preview", "fit"])  # the tokenizer's and the model's loading
def test_missing_local_model_path_in_fit(command, data_args, tmp_path, capsys):
    missing = f"./{tmp_path.name}-missing/model"
    root = [f"--trainer.default_root_dir={tmp_path}"] if command == "fit" else []  # its own run root
    message = fails_with([command, *data_args(f"--model.model_name_or_path={missing}"), *root], capsys)
    assert "model.model_name_or_path" in message and "does not exist" in message
    assert "repo" not in message.lower() and "hub" not in message.lower()


def test_export_base_model_errors_name_base_model(trained_run, tmp_path, capsys):
    missing = tmp_path / "no-base"
    message = fails_with(
        [
            "export",
            f"--ckpt_path={trained_run / 'checkpoints' / 'last.ckpt'}",
            f"--output_dir={tmp_path / 'out'}",
            f"--base_model={missing}",
        ],
        capsys,
    )
    assert message.startswith("mlm_adapt: error: --base_model:") and "does not exist" in message
    assert "model.model_name_or_path" not in message


def test_lightning_misconfiguration_is_one_line_traceback_under_debug(
    data_args, tmp_path, capsys, monkeypatch
):
    # Set (not deleted) so that monkeypatch removes what --debug exports for the process at teardown.
    monkeypatch.setenv("MLM_ADAPT_DEBUG", "0")
    # A Lightning user error raised while building the Trainer (before any data is read).
    args = ["fit", *data_args(), "--trainer.accelerator=cpu", "--trainer.max_steps=1", "--trainer.devices=0"]
    args.append(f"--trainer.default_root_dir={tmp_path}")
    message = fails_with(args, capsys)
    assert "devices" in message
    with pytest.raises(Exception) as raised:  # --debug: the original exception and its traceback
        main([*args, "--debug"])
    assert type(raised.value).__name__ == "MisconfigurationException"
    monkeypatch.setenv("MLM_ADAPT_DEBUG", "1")
    with pytest.raises(Exception) as raised:
        main(args)
    assert type(raised.value).__name__ == "MisconfigurationException"


@pytest.mark.parametrize(
    ("flag", "words"),
    [
        ("--trainer.strategy=fsdp", ["fsdp", "GPU"]),  # ValueError, Lightning's accelerator connector
        ("--trainer.num_nodes=0", ["num_nodes", "positive integer"]),  # ValueError, its device checks
        ("--trainer.devices=-5", ["devices", "CPUAccelerator"]),  # TypeError, the CPU accelerator
    ],
)
def test_lightning_error_about_a_trainer_flag_is_one_line(
    flag, words, data_args, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("MLM_ADAPT_DEBUG", "0")
    args = ["fit", *data_args(), "--trainer.accelerator=cpu", flag, f"--trainer.default_root_dir={tmp_path}"]
    message = fails_with(args, capsys)  # raised by Lightning while it builds the Trainer
    assert message.startswith("mlm_adapt: error: trainer: ") and all(word in message for word in words)


def _lightning_raises_value_error(*_args, **_kwargs):
    from lightning.pytorch.utilities import grad_norm

    grad_norm(None, norm_type=-1)  # raises its ValueError in Lightning's own code


def _the_tool_raises_value_error(*_args, **_kwargs):
    from mlm_adapt.masking.collator import masking_units

    masking_units(None, None, "no_such_scheme")  # raises its ValueError in the tool's own code


@pytest.mark.parametrize(
    ("raiser", "match"),
    [(_lightning_raises_value_error, "norm_type"), (_the_tool_raises_value_error, "no_such_scheme")],
    ids=["lightning", "mlm_adapt"],
)
def test_other_value_error_while_the_trainer_is_built_keeps_its_traceback(
    raiser, match, data_args, tmp_path, monkeypatch
):
    """Raised from code that Trainer.__init__ runs (where it logs the devices), outside Lightning's
    argument checks: a bug, not a bad flag."""
    monkeypatch.setenv("MLM_ADAPT_DEBUG", "0")
    monkeypatch.setattr("lightning.pytorch.trainer.setup._log_device_info", raiser)
    with pytest.raises(ValueError, match=match):
        main(["fit", *data_args(), "--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}"])


@pytest.mark.slow
def test_traceback_only_with_debug_in_a_subprocess(tiny_model_dir, tmp_path):
    args = ["fill-mask", "好" * 300 + "[MASK]", "--model", str(tiny_model_dir)]
    # A new interpreter: what it prints at shutdown (ignored exceptions, leaked resources) counts too.
    quiet = run_cli(*args, fresh_interpreter=True)
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr
    assert quiet.stderr.strip().splitlines()[-1].startswith("mlm_adapt: error:")
    loud = run_cli(*args, "--debug")
    assert loud.returncode != 0 and "Traceback" in loud.stderr


def _demo_fit(tiny_model_dir: Path, corpus: Path, root: Path, *extra: str):
    """``fit --config configs/demo.yaml`` on the tiny model, 2 steps, run in ``root`` (its relative paths).

    The demo's second validation set and its downstream tasks come from ``prepare_demo.py``; here the
    general set is the test corpus and the tasks are off (what is tested is the trainer flags).
    """
    return run_cli(
        "fit",
        "--config",
        str(REPO / "configs" / "demo.yaml"),
        f"--model.model_name_or_path={tiny_model_dir}",
        "--model.max_seq_length=64",
        f"--data.train_files=[{corpus}]",
        f"--data.validation_files={{domain: null, general: [{corpus}]}}",
        "--downstream.tasks=[]",
        "--data.num_workers=0",
        "--data.batch_size=8",
        f"--data.cache_dir={root / 'hf_cache'}",
        "--trainer.max_steps=2",
        "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=1",
        *extra,
        cwd=root,
    )


@pytest.mark.slow
def test_demo_config_with_progress_bar_off(tiny_model_dir, corpus_file, tmp_path):
    result = _demo_fit(tiny_model_dir, corpus_file, tmp_path, "--trainer.enable_progress_bar=false")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "runs" / "demo" / "export" / "config.json").is_file()


@pytest.mark.slow
def test_demo_config_with_logger_off(tiny_model_dir, corpus_file, tmp_path):
    result = _demo_fit(tiny_model_dir, corpus_file, tmp_path, "--trainer.logger=false")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "runs" / "demo" / "export" / "config.json").is_file()
