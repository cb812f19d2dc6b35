"""Bad segmenter and OpenCC inputs end in one ``mlm_adapt: error:`` line (exit 2), no traceback."""

from __future__ import annotations

import pytest

from mlm_adapt.cli.commands import main


class RaisesOnBadReview:
    """A user segmenter that crashes on one text of the corpus."""

    def segment(self, texts: list[str]) -> list[list[str]]:
        if any("差评" in t for t in texts):
            raise RuntimeError("segmenter model crashed")
        return [list(t) for t in texts]


class StringPerText:
    """A user segmenter that returns each text as a string, not a list of words."""

    def segment(self, texts: list[str]) -> list[str]:
        return [t.replace(" ", "") for t in texts]


HERE = __name__
CASES = {
    # name: (command, extra arguments, expected start of the message after "mlm_adapt: error: ")
    "unknown-class-path": (
        "fit",
        ["--data.segmentation.segmenter=no_such_pkg.Segmenter"],
        "data.segmentation.segmenter: cannot use class_path 'no_such_pkg.Segmenter' (No module named "
        "'no_such_pkg')",
    ),
    "unknown-name": (
        "fit",
        ["--data.segmentation.segmenter=ltp"],
        "data.segmentation.segmenter: unknown segmenter 'ltp'",
    ),
    "unknown-opencc": (
        "fit",
        ["--data.segmentation.opencc=t3s"],
        "data.segmentation.opencc: unknown OpenCC configuration 't3s'",
    ),
    "segmenter-raises": (
        "preview",
        [f"--data.segmentation.segmenter={HERE}.RaisesOnBadReview"],
        f"data.segmentation.segmenter: {HERE}.RaisesOnBadReview raised RuntimeError: segmenter model crashed "
        "on the text",
    ),
    "str-per-text": (
        "fit",
        [f"--data.segmentation.segmenter={HERE}.StringPerText", "--trainer.max_steps=1"],
        f"data.segmentation.segmenter: {HERE}.StringPerText returned a str instead of a list of words on the "
        "text",
    ),
    "jieba-option-with-other-segmenter": (
        "preview",
        ["--data.segmentation.segmenter=snownlp", "--data.segmentation.hmm=true"],
        "data.segmentation.hmm/data.segmentation.user_dict apply to rjieba and jieba, not snownlp",
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_segmenter_input_is_one_line(case, tiny_model_dir, tmp_path, capsys):
    command, extra, expected = CASES[case]
    corpus = tmp_path / "reviews.txt"
    corpus.write_text("物流 很快 ，好评\n质量一般，差评\n" * 20, encoding="utf-8")
    args = [
        f"--model.model_name_or_path={tiny_model_dir}",
        "--model.max_seq_length=64",
        f"--data.train_files=[{corpus}]",
        "--data.num_workers=0",
        f"--data.cache_dir={tmp_path / 'cache'}",
        "--trainer.logger=false",
        *extra,
    ]
    with pytest.raises(SystemExit) as exit_info:
        main([command, *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("mlm_adapt: error:")]
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith(f"mlm_adapt: error: {expected}"), lines[0]
    assert "Traceback" not in err
