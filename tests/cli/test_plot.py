"""``plot`` and ``vocab`` subcommands, and val/word_accuracy in a real fit's CSV log."""

from __future__ import annotations

import pytest
from conftest import tiny_fit_args

from mlm_adapt.cli import main
from mlm_adapt.cli.plot import plot_main
from mlm_adapt.errors import MLMAdaptError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plot_without_a_csv_log_is_a_one_line_error(tmp_path):
    with pytest.raises(MLMAdaptError, match="no metrics.csv"):
        plot_main([str(tmp_path)])


@pytest.mark.slow
def test_fit_logs_word_accuracy_and_plot_draws_it(tiny_model_dir, corpus_file, tmp_path):
    root = tmp_path / "run"
    extra = ["--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={root}"]
    extra += [
        "--trainer.log_every_n_steps=2",
        "--trainer.val_check_interval=3",
        "--data.masking.scheme=ngram",
    ]
    main(["fit", *tiny_fit_args(tiny_model_dir, corpus_file, root, *extra)])
    (metrics,) = root.rglob("metrics.csv")
    header = metrics.read_text().splitlines()[0].split(",")
    assert {"train/loss", "val/loss", "val/accuracy", "val/word_accuracy", "val/perplexity"} <= set(header)
    main(["plot", str(root), "--output", str(tmp_path / "curves.png")])  # dispatched by the CLI
    assert (tmp_path / "curves.png").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize("target", ["victim.txt", "metrics.csv"], ids=["a_user_file", "the_log_itself"])
def test_plot_replaces_a_link_planted_at_its_default_output(tmp_path, target):
    """The default curves.png lies in a run directory: a link there is replaced, never written through."""
    log = "step,train/loss\n1,5.0\n2,4.0\n"
    (tmp_path / "metrics.csv").write_text(log, encoding="utf-8")
    (tmp_path / "victim.txt").write_text("the user's file\n", encoding="utf-8")
    (tmp_path / "curves.png").symlink_to(tmp_path / target)
    plot_main([str(tmp_path / "metrics.csv")])
    assert (tmp_path / "victim.txt").read_text(encoding="utf-8") == "the user's file\n"
    assert (tmp_path / "metrics.csv").read_text(encoding="utf-8") == log
    assert not (tmp_path / "curves.png").is_symlink()
    assert (tmp_path / "curves.png").read_bytes()[:8] == PNG_MAGIC


def test_vocab_command_reports_and_writes(tiny_model_dir, corpus_file, tmp_path, capsys):
    out_dict, out_tokens = tmp_path / "user_dict.txt", tmp_path / "new_tokens.txt"
    main(
        [
            "vocab",
            f"--model.model_name_or_path={tiny_model_dir}",
            f"--data.train_files=[{corpus_file}]",
            "--min_count=3",
            "--top_k=5",
            f"--output_dict={out_dict}",
            f"--output_tokens={out_tokens}",
        ]
    )
    stdout = capsys.readouterr().out
    assert "[UNK] rate:" in stdout and "candidate terms (HMM words that rjieba splits" in stdout
    terms = out_dict.read_text(encoding="utf-8").split()
    assert terms and all(len(t) > 1 for t in terms)
    chars = out_tokens.read_text(encoding="utf-8").split()
    assert 0 < len(chars) <= 5  # the tiny model's 1500-character vocabulary misses some review characters
