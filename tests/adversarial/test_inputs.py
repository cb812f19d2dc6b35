"""Adversarial inputs: empty or malformed corpus, task, dictionary and metrics files, literal special-token
text, and validation sets that overlap the training data.

Each case ends in one ``MLMAdaptError`` line naming the file or key (or, for warnings, one warning line).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import make_datamodule

from mlm_adapt.cli.commands import main
from mlm_adapt.data.validation_sets import overlap_messages
from mlm_adapt.downstream import load_task
from mlm_adapt.errors import MLMAdaptError
from mlm_adapt.text.alignment import control_ids, tokenize_with_word_ids
from mlm_adapt.text.segmentation import JiebaSegmenter, read_user_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from families import FAMILIES, family_dir  # noqa: E402


def one_line(exc_info: pytest.ExceptionInfo) -> str:
    message = str(exc_info.value)
    assert message and "\n" not in message
    return message


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------- corpus files


CORPUS_CASES = {
    # name: (file name, content, extra datamodule args, expected fragment)
    "empty_txt": ("empty.txt", "", {}, "empty.txt is empty"),
    "empty_csv": ("empty.csv", "", {}, "empty.csv is empty"),
    "one_document": ("one.txt", "只有一篇文档，没有验证集。\n", {}, "holds 1 document, too few to hold out"),
    "split_zero": (
        "two.txt",
        "第一篇文档。\n第二篇文档。\n",
        {"validation_split": 0.0},
        "need validation data",
    ),
    "seq_too_short": (
        "ok.txt",
        "文档。\n" * 20,
        {"max_seq_length": 4},
        "model.max_seq_length=4 is too short",
    ),
}


@pytest.mark.parametrize("case", list(CORPUS_CASES), ids=list(CORPUS_CASES))
def test_corpus_file_errors_are_one_line_naming_the_file(case, tiny_model_dir, tmp_path):
    name, content, extra, expected = CORPUS_CASES[case]
    corpus = tmp_path / name
    corpus.write_text(content, encoding="utf-8")
    with pytest.raises(MLMAdaptError) as info:
        datamodule = make_datamodule(tiny_model_dir, corpus, tmp_path, **extra)
        datamodule.setup("fit")
    message = one_line(info)
    assert expected in message
    assert "An error occurred while generating the dataset" not in message
    assert not message.rstrip().endswith(":")


# ---------------------------------------------------------------- task files


def _ner_rows(tag_of: dict[str, str]) -> list[dict]:
    words = [("北", "京"), ("张", "三"), ("的",), ("上", "海")]
    rows = []
    for i in range(12):
        tokens, tags = [], []
        for word in words[i % 4 :] + words[: i % 4]:
            kind = "LOC" if word[0] in "北上" else "PER" if word[0] == "张" else None
            for j, ch in enumerate(word):
                tokens.append(ch)
                tags.append("O" if kind is None else tag_of["B" if j == 0 else "I"] + kind)
        rows.append({"tokens": tokens, "tags": tags})
    return rows


def _sentiment(path: Path) -> Path:
    return write_jsonl(
        path, [{"text": f"第{i}条评论", "label": "pos" if i % 2 else "neg"} for i in range(10)]
    )


def _task(tmp_path: Path, case: str) -> dict:
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    entry = {"name": "sentiment", "train_files": [str(train)], "test_files": [str(test)]}
    if case == "empty_train_file":
        train.write_text("", encoding="utf-8")
        _sentiment(test)
    elif case == "bioes_tags":
        write_jsonl(train, _ner_rows({"B": "S-", "I": "E-"}))
        write_jsonl(test, _ner_rows({"B": "S-", "I": "E-"}))
        entry["type"] = "token_classification"
    else:
        _sentiment(train)
        _sentiment(test)
        entry["name"] = "a|b"
    return entry


TASK_CASES = {
    "empty_train_file": "train.jsonl is empty",
    "bioes_tags": "is not BIO (O, B-TYPE, I-TYPE)",
    "pipe_name": "cannot name metrics, log lines and model-card rows",
}


@pytest.mark.parametrize("case", list(TASK_CASES), ids=list(TASK_CASES))
def test_task_file_errors_are_one_line(case, tmp_path):
    with pytest.raises(MLMAdaptError) as info:
        load_task(_task(tmp_path, case), 0)
    message = one_line(info)
    assert message.startswith("downstream.tasks[0].") and TASK_CASES[case] in message


def test_bio_task_and_unicode_task_name_still_load(tmp_path):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    write_jsonl(train, _ner_rows({"B": "B-", "I": "I-"}))
    write_jsonl(test, _ner_rows({"B": "B-", "I": "I-"}))
    entry = {"name": "命名实体_v1.0", "train_files": [str(train)], "test_files": [str(test)]}
    loaded = load_task({**entry, "type": "token_classification"}, 0)
    assert loaded.label_names[0] == "O" and "B-LOC" in loaded.label_names


# ---------------------------------------------------------------- user dictionary and plot


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("术语 100000000000000000000000000", "line 2: frequency 1000"),
        ("医保 ² n", "frequency '²' is not an integer"),
        ("医保 -5 n", "frequency -5 is below 0"),
    ],
    ids=["frequency_1e26", "superscript_digit", "negative"],
)
def test_user_dictionary_frequency(line, expected, tmp_path):
    path = tmp_path / "dict.txt"
    path.write_text(f"正常词 10\n{line}\n", encoding="utf-8")
    with pytest.raises(MLMAdaptError) as info:
        read_user_dict(path)
    message = one_line(info)
    assert message.startswith(f"data.segmentation.user_dict: {path} line 2") and expected in message


def test_user_dictionary_frequency_in_full_width_digits_is_read(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_text("医保 １０ n\n术语 ٣\n", encoding="utf-8")
    assert read_user_dict(path) == [("医保", 10, "n"), ("术语", 3, None)]


def test_user_dictionary_large_but_sane_frequency_segments(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_text("领域术语 1000000000000\n", encoding="utf-8")
    assert "领域术语" in JiebaSegmenter(user_dict=str(path))("这是领域术语。")


PLOT_CASES = {
    "header_only": ("epoch,step,train/loss\n", "has a header but no rows"),
    "binary_garbage": ("\x00\xff\xfe garbage", "is not a readable CSV file"),
}


@pytest.mark.parametrize("case", list(PLOT_CASES), ids=list(PLOT_CASES))
def test_plot_on_unusable_metrics_csv_is_one_line(case, tmp_path, capsys):
    content, expected = PLOT_CASES[case]
    metrics = tmp_path / "metrics.csv"
    metrics.write_bytes(content.encode("latin-1"))
    with pytest.raises(SystemExit) as info:
        main(["plot", str(metrics), "--output", str(tmp_path / "curves.png")])
    assert info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlm_adapt: error: plot:") and expected in lines[0]
    assert not (tmp_path / "curves.png").exists()


# ---------------------------------------------------------------- literal special-token text

SPECIAL_TEXT = "北京[MASK]你好<mask>世界<s>[CLS]文本</s>[SEP]<pad>结束"


@pytest.mark.parametrize("family", FAMILIES)
def test_special_token_text_is_text_for_every_family(family):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(family_dir(family))
    out = tokenize_with_word_ids([SPECIAL_TEXT, "普通的句子。"], tokenizer, JiebaSegmenter())
    ids = out["input_ids"][0]
    assert not control_ids(tokenizer) & set(ids), tokenizer.convert_ids_to_tokens(ids)
    assert len(ids) == len(out["word_ids"][0])
    # The characters of the literal strings are all there, as ordinary pieces (where the tiny vocabulary
    # has every letter of the word: which Latin letters a 600-review vocabulary keeps is not fixed).
    pieces = "".join(tokenizer.convert_ids_to_tokens(ids)).replace("##", "").lower()
    unknown = {tokenizer.unk_token_id}
    for fragment in ("mask", "cls", "sep", "pad"):
        spelled = tokenizer(list(fragment), is_split_into_words=True, add_special_tokens=False)["input_ids"]
        if not unknown & set(spelled):
            assert fragment in pieces
    # Text without special-token strings is exactly the tokenizer's own tokenization.
    assert out["input_ids"][1] == tokenizer("普通的句子。", add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------- validation overlap


def _docs(lines: list[str]):
    import datasets

    return datasets.Dataset.from_dict({"text": lines})


TRAIN_LINES = [f"训练文档第{i}篇，内容足够长。" for i in range(50)]
OTHER_LINES = [f"验证文档第{i}篇，内容不同。" for i in range(20)]
OVERLAP_CASES = {
    "same_file": ("train", TRAIN_LINES, "is also training data"),
    "identical_lines": ("other", TRAIN_LINES[:5] + OTHER_LINES, "5 of 25"),
    "disjoint": ("other", OTHER_LINES, None),
    "short_repeats_ignored": ("other", ["好评", "谢谢"], None),
}


@pytest.mark.parametrize("case", list(OVERLAP_CASES), ids=list(OVERLAP_CASES))
def test_validation_overlap_warning(case, tmp_path):
    which, lines, expected = OVERLAP_CASES[case]
    train_file = tmp_path / "train.txt"
    other = tmp_path / "val.txt"
    files = [str(train_file)] if which == "train" else [str(other)]
    messages = overlap_messages(
        _docs(TRAIN_LINES), [str(train_file)], {"data.validation_files": (files, _docs(lines))}
    )
    if expected is None:
        assert messages == []
    else:
        assert len(messages) == 1 and "\n" not in messages[0] and expected in messages[0]
        assert messages[0].startswith("data.validation_files:")
