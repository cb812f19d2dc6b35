"""The ``forgetting:`` group (``--forgetting.*``): parsed as one typed option set the data module holds, the
old ``data.forgetting_*`` keys refused naming their new one, and the old hyperparameters still read."""

from __future__ import annotations

import pytest
import yaml

from mlm_adapt.cli import main
from mlm_adapt.data.forgetting import RENAMED_KEYS, ForgettingOptions, forgetting_of

OLD_VALUES = {
    "forgetting_warning": "0.2",
    "forgetting_budget": "0.2",
    "forgetting_check_interval": "3",
    "forgetting_check_batches": "2",
}


def _one_error_line(capsys, args: list[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(args)
    assert stopped.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("old", list(RENAMED_KEYS))
def test_an_old_key_on_the_command_line_is_one_line_naming_the_new_one(old, tiny_model_dir, capsys):
    base = ["fit", f"--model.model_name_or_path={tiny_model_dir}", "--data.train_files=[a.txt]"]
    line = _one_error_line(capsys, [*base, f"--data.{old}={OLD_VALUES[old]}"])
    assert line == f"mlm_adapt: error: data.{old} is now forgetting.{RENAMED_KEYS[old]}"
    # As a separate value, after other unknown arguments too.
    line = _one_error_line(capsys, [*base, "--data.no_such_key=1", f"--data.{old}", OLD_VALUES[old]])
    assert line == f"mlm_adapt: error: data.{old} is now forgetting.{RENAMED_KEYS[old]}"


def test_an_old_key_in_a_config_or_a_data_mapping_is_one_line(tiny_model_dir, tmp_path, capsys):
    config = tmp_path / "old.yaml"
    data = {"train_files": ["a.txt"], "forgetting_budget": 0.2}
    config.write_text(yaml.safe_dump({"data": data}), encoding="utf-8")
    model = f"--model.model_name_or_path={tiny_model_dir}"
    expected = "mlm_adapt: error: data.forgetting_budget is now forgetting.budget"
    assert _one_error_line(capsys, ["fit", model, "--config", str(config)]) == expected
    assert _one_error_line(capsys, ["fit", model, "--data", "{forgetting_budget: 0.2}"]) == expected
    # Any other unknown key keeps the parser's own message.
    other = _one_error_line(capsys, ["fit", model, "--data.train_files=[a.txt]", "--data.forgetting=1"])
    assert "is now" not in other


def test_the_group_reaches_the_data_module_typed_and_stays_plain_in_its_hyperparameters(
    tiny_model_dir, corpus_file, tmp_path
):
    from mlm_adapt.cli.fit import MLMAdaptCLI

    cli = MLMAdaptCLI(
        args=[
            f"--model.model_name_or_path={tiny_model_dir}",
            "--model.max_seq_length=64",
            f"--data.train_files=[{corpus_file}]",
            f"--data.cache_dir={tmp_path / 'cache'}",
            "--forgetting.warning=0.3",
            "--forgetting.check_batches=2",
            "--trainer.logger=false",
        ],
        run=False,
    )
    options = cli.datamodule.forgetting
    assert options == ForgettingOptions(warning=0.3, check_batches=2)
    plain = {"warning": 0.3, "budget": None, "check_interval": None, "check_batches": 2}
    assert cli.datamodule.hparams["forgetting"] == plain == cli.datamodule.hparams_initial["forgetting"]
    assert not [key for key in cli.datamodule.hparams if key.startswith("forgetting_")]
    # The callbacks read the data module's options, not its hyperparameters by name.
    from types import SimpleNamespace

    from mlm_adapt.training.callbacks import forgetting_options

    assert forgetting_options(SimpleNamespace(datamodule=cli.datamodule)) is options


def test_hyperparameters_of_either_version_read_as_the_options():
    old = {"forgetting_budget": 0.2, "forgetting_check_interval": 5, "forgetting_warning": None}
    assert forgetting_of(old) == ForgettingOptions(budget=0.2, check_interval=5)
    assert forgetting_of({"forgetting": {"budget": 0.1, "check_batches": 1}}) == ForgettingOptions(
        budget=0.1, check_batches=1
    )
    assert forgetting_of({}) == ForgettingOptions()


def test_fit_help_lists_the_group_and_not_the_old_keys(capsys, monkeypatch):
    monkeypatch.setenv("MLM_ADAPT_HELP_CACHE", "")
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = capsys.readouterr().out
    for name in ("warning", "budget", "check_interval", "check_batches"):
        assert f"--forgetting.{name} " in text
    # data.forgetting is linked from the group: no option of its own, not even jsonargparse's .help.
    assert "--data.forgetting_" not in text and "--data.forgetting " not in text
    assert "--data.forgetting.help" not in text
    assert "forgetting --> data.forgetting" in text and "--data.max_mix_rate" in text
