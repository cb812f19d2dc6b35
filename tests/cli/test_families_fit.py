"""A short CLI fit of every model family: validation perplexity falls, the export reloads and reads well."""

from __future__ import annotations

import csv
import unicodedata

import pytest
from conftest import run_cli, tiny_fit_args
from families import FAMILIES, family_dir, training_texts
from transformers import AutoModelForMaskedLM, AutoTokenizer

from mlm_adapt.cli.fill_mask import predict

BYTE_SYMBOLS = set("ĠĊĳĲĹĺĻļĽľĿŀŁł")  # GPT-2's stand-ins for bytes, never in readable Chinese text


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_fit_export_reload_and_fill_mask(family, tmp_path):
    corpus = tmp_path / "reviews.txt"
    corpus.write_text("\n".join(training_texts()) + "\n", encoding="utf-8")
    args = tiny_fit_args(
        family_dir(family),
        corpus,
        tmp_path,
        "--model.optimizer=torch.optim.AdamW",
        "--model.optimizer.lr=0.01",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={tmp_path}",
        "--trainer.enable_checkpointing=false",
        f"--export.output_dir={tmp_path / 'export'}",
    )
    result = run_cli("fit", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    # A full checkpoint of the family loads without a word about its head; no library advertises.
    assert "masked-LM head" not in result.stderr and "💡" not in result.stdout + result.stderr
    rows = list(csv.DictReader(next(tmp_path.rglob("metrics.csv")).open()))
    val = [(int(r["step"]), float(r["val/perplexity"])) for r in rows if r.get("val/perplexity")]
    assert val[0][0] == 0 and val[-1][0] == 6  # the step-0 baseline, then the final weights
    assert val[-1][1] < val[0][1]

    model = AutoModelForMaskedLM.from_pretrained(tmp_path / "export").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "export")
    assert type(model).__name__ == type(AutoModelForMaskedLM.from_pretrained(family_dir(family))).__name__
    mask = tokenizer.mask_token
    predictions, fillings = predict(model, tokenizer, f"这本书{mask}{mask}好，值得一看", top_k=3)
    assert len(predictions) == 2 and len(fillings) == 1
    shown = "".join(t for p in predictions for t, _ in p.candidates) + fillings[0].word + fillings[0].text
    assert not BYTE_SYMBOLS & set(shown)
    assert fillings[0].text.startswith("这本书") and "值得一看" in fillings[0].text


@pytest.mark.parametrize("family", ["modernbert", "xlmr"])
def test_preview_prints_decoded_text(family):
    import datasets

    from mlm_adapt.cli.data_only import batch_examples, render_text
    from mlm_adapt.data.preprocess import to_blocks
    from mlm_adapt.masking import WholeWordMaskCollator
    from mlm_adapt.text.segmentation import JiebaSegmenter

    tokenizer = AutoTokenizer.from_pretrained(family_dir(family))
    lines = training_texts()[:16]
    datasets.disable_progress_bars()
    blocks = to_blocks(
        datasets.Dataset.from_dict({"text": lines}), tokenizer, JiebaSegmenter(), 128, packing=False
    )
    batch = WholeWordMaskCollator(tokenizer, mlm_probability=0.3)([blocks[i] for i in range(len(blocks))])
    source = unicodedata.normalize("NFKC", "".join(lines)).lower()
    specials = set(tokenizer.all_special_tokens)
    texts = [render_text(example, tokenizer) for example in batch_examples(batch, tokenizer)]
    assert sum("【" in text for text in texts) > len(texts) // 2
    for example, text in zip(batch_examples(batch, tokenizer), texts, strict=True):
        assert "masked" in text.splitlines()[0]
        assert not BYTE_SYMBOLS & set(text)
        assert not BYTE_SYMBOLS & set("".join(example["tokens"]))
        # Every word shown unmasked is text of the corpus (decoded, not pieces).
        for word in text.splitlines()[1].split(" "):
            if not set("【→】") & set(word) and word not in specials:
                assert unicodedata.normalize("NFKC", word).lower() in source, word


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_preview_shows_a_unit_holding_an_unknown_token(family):
    from mlm_adapt.cli.data_only import render_text

    tokenizer = AutoTokenizer.from_pretrained(family_dir(family))
    ids = [tokenizer.cls_token_id, *tokenizer("好书", add_special_tokens=False)["input_ids"]]
    ids += [tokenizer.unk_token_id, tokenizer.sep_token_id]
    n = len(ids)
    labels = [-100] * n
    labels[1:-2] = ids[1:-2]  # the word is masked; its <unk> position is never predicted
    seen = [tokenizer.mask_token_id if label != -100 else i for i, label in zip(ids, labels, strict=True)]
    example = {
        "tokens": [],
        "input_ids": seen,
        "labels": labels,
        "attention_mask": [1] * n,
        "word_ids": [None] + [0] * (n - 2) + [None],
    }
    line = render_text(example, tokenizer).splitlines()[1]
    assert "【好书" in line and tokenizer.unk_token in line
