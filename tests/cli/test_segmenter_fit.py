"""User class-path segmenters through the CLI: with data.segmentation.opencc on Traditional text, without
type hints."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_fit_args

from mlm_adapt.cli.commands import main


class LongestWords:
    """A user segmenter (no mlm_adapt base class): rjieba's words, merged up to ``max_chars`` characters."""

    def __init__(self, max_chars: int = 4) -> None:
        self.max_chars = max_chars

    def segment(self, texts: list[str]) -> list[list[str]]:
        import rjieba

        result = []
        for text in texts:
            words: list[str] = []
            for word in rjieba.cut(text, False):
                if words and len(words[-1]) + len(word) <= self.max_chars and not word.isspace():
                    words[-1] += word
                else:
                    words.append(word)
            result.append(words)
        return result


@pytest.mark.slow
def test_class_path_segmenter_with_opencc_fits_and_is_resume_fixed(
    tiny_model_dir, review_texts, tmp_path, capsys
):
    opencc = pytest.importorskip("opencc")
    corpus = tmp_path / "traditional.txt"
    to_traditional = opencc.OpenCC("s2t")
    corpus.write_text("\n".join(to_traditional.convert(t) for t in review_texts) + "\n", encoding="utf-8")
    segmenter = {"class_path": f"{__name__}.LongestWords", "init_args": {"max_chars": 3}}
    checkpoint = (
        '{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", '
        f'"init_args": {{"save_last": true, "dirpath": "{tmp_path / "ckpt"}"}}}}'
    )
    args = tiny_fit_args(
        tiny_model_dir,
        corpus,
        tmp_path,
        f"--data.segmentation.segmenter={json.dumps(segmenter)}",
        "--data.segmentation.opencc=t2s",
        "--trainer.max_steps=3",
        "--trainer.val_check_interval=3",
        f"--trainer.callbacks+={checkpoint}",
        "--export.checkpoint=none",
        f'--trainer.logger={{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": '
        f'{{"save_dir": "{tmp_path / "logs"}"}}}}',
    )
    main(["fit", *args])
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
    segmentation = saved["datamodule_hyper_parameters"]["segmentation"]
    assert segmentation["segmenter"] == segmenter and segmentation["opencc"] == "t2s"
    (metrics,) = tmp_path.rglob("metrics.csv")
    assert "val/loss" in metrics.read_text().splitlines()[0]
    # Another init arg changes the words masked as a whole: resuming with it is refused in one line.
    changed = {**segmenter, "init_args": {"max_chars": 2}}
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, f"--data.segmentation.segmenter={json.dumps(changed)}", "--ckpt_path=last"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "data.segmentation.segmenter.init_args.max_chars: 3 -> 2" in err, err[-2000:]


class Characters:
    """A user segmenter written without type hints, as the protocol's docs allow."""

    def __init__(self, tag="chars"):
        self.tag = tag

    def segment(self, texts):
        return [list(t) for t in texts]


class NoSegmentMethod:
    """A class given as data.segmentation.segmenter that is no segmenter."""

    def __init__(self, tag="none"):
        self.tag = tag


@pytest.mark.slow
def test_segmenter_without_type_hints_fits(tiny_model_dir, corpus_file, tmp_path):
    segmenter = {"class_path": f"{__name__}.Characters", "init_args": {"tag": "x"}}
    checkpoint = (
        '{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", '
        f'"init_args": {{"save_last": true, "dirpath": "{tmp_path / "ckpt"}"}}}}'
    )
    args = tiny_fit_args(
        tiny_model_dir,
        corpus_file,
        tmp_path,
        f"--data.segmentation.segmenter={json.dumps(segmenter)}",
        "--trainer.max_steps=2",
        "--trainer.limit_val_batches=1",
        "--trainer.logger=false",
        f"--trainer.callbacks+={checkpoint}",
        "--export.checkpoint=none",
    )
    main(["fit", *args])
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["datamodule_hyper_parameters"]["segmentation"]["segmenter"] == segmenter


@pytest.mark.parametrize(
    "value",
    [f"{__name__}.NoSegmentMethod", json.dumps({"class_path": f"{__name__}.NoSegmentMethod"})],
    ids=["class-path", "mapping"],
)
def test_class_without_segment_method_is_refused_in_one_line(
    value, tiny_model_dir, corpus_file, tmp_path, capsys
):
    args = tiny_fit_args(tiny_model_dir, corpus_file, tmp_path, f"--data.segmentation.segmenter={value}")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mlm_adapt: error:")]
    assert lines == [
        f"mlm_adapt: error: data.segmentation.segmenter: {__name__}.NoSegmentMethod has no segment(texts) "
        "method; use a built-in name (rjieba, jieba, thulac, snownlp, pkuseg) or the class_path of a class "
        "with segment(texts)"
    ]
