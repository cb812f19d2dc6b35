"""The ``forgetting:`` group (``--forgetting.*``): parsed as one typed option set the data module holds."""

from __future__ import annotations

import pytest

from mlm_adapt.cli import main
from mlm_adapt.data.forgetting import ForgettingOptions


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
    plain = {
        "warning": 0.3,
        "budget": None,
        "check_interval": None,
        "check_batches": 2,
        "max_replay_rate": 0.5,
    }
    assert cli.datamodule.hparams["forgetting"] == plain == cli.datamodule.hparams_initial["forgetting"]
    assert not [key for key in cli.datamodule.hparams if key.startswith("forgetting_")]
    # The callbacks read the data module's options, not its hyperparameters by name.
    from types import SimpleNamespace

    from mlm_adapt.training.callbacks import forgetting_options

    assert forgetting_options(SimpleNamespace(datamodule=cli.datamodule)) is options


def test_fit_help_lists_the_group_under_forgetting_only(capsys, monkeypatch):
    monkeypatch.setenv("MLM_ADAPT_HELP_CACHE", "")
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = capsys.readouterr().out
    for name in ("warning", "budget", "check_interval", "check_batches"):
        assert f"--forgetting.{name} " in text
    # data.forgetting is linked from the group: no option of its own, not even jsonargparse's .help.
    assert "--data.forgetting_" not in text and "--data.forgetting " not in text
    assert "--data.forgetting.help" not in text
    assert "forgetting --> data.forgetting" in text and "--forgetting.max_replay_rate" in text
