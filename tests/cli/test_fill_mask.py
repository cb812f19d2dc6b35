"""``python -m mlm_adapt fill-mask``: per-mask top-k, whole-word fillings, ``--mask_attention exclude``."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import AutoModelForMaskedLM, pipeline

from mlm_adapt.cli import main
from mlm_adapt.cli.fill_mask import predict

TEXT = "北京[MASK][MASK]你！"


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_dir):
    return AutoModelForMaskedLM.from_pretrained(tiny_model_dir).eval()


def run_fill_mask(capsys, *args: str) -> list[str]:
    main(["fill-mask", *args])
    return capsys.readouterr().out.splitlines()


def test_output_format_plain_and_side_by_side(tiny_model_dir, capsys):
    plain = run_fill_mask(capsys, "--model", str(tiny_model_dir), TEXT, "--top_k", "3")
    both = run_fill_mask(
        capsys, "--model", str(tiny_model_dir), TEXT, "--top_k", "3", "--mask_attention", "exclude"
    )
    assert plain[:2] == [f"model: {tiny_model_dir}", f"text: {TEXT}"]
    assert plain[3].split() == ["[MASK]", "attended"]
    assert both[3].split() == ["[MASK]", "attended", "[MASK]", "not", "attended"]
    cell = r"(\d)\. (\S+) (\d\.\d{4}|\d\.\d\de-\d\d)"
    for lines, columns in ((plain, 1), (both, 2)):
        ranked = lines[4:10]
        assert ranked[0].startswith("mask 1 (#3)") and ranked[3].startswith("mask 2 (#4)")
        for i, line in enumerate(ranked):
            cells = re.findall(cell, line)
            assert len(cells) == columns and all(int(c[0]) == i % 3 + 1 for c in cells), line
        assert lines[11].startswith("best whole-word filling per run of masks")
        filling = re.fullmatch(r"masks 1-2\s+" + r"\s+".join([r"(\S{2}) p=(\S+)"] * columns), lines[12])
        assert filling, lines[12]
        assert lines[13] == f"[MASK] attended: 北京{filling.group(1)}你！"
    assert both[4:10][0].split()[3:6] == plain[4:10][0].split()[3:6]  # left column = the plain run


def test_top_k_probabilities_are_the_pipelines(tiny_model_dir, tiny_lm):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    (prediction,), _ = predict(tiny_lm, tokenizer, "这本书很[MASK]看", top_k=5)
    reference = pipeline("fill-mask", model=str(tiny_model_dir))("这本书很[MASK]看", top_k=20)
    special = set(tokenizer.all_special_tokens)
    expected = [(r["token_str"], r["score"]) for r in reference if r["token_str"] not in special][:5]
    assert [t for t, _ in prediction.candidates] == [t for t, _ in expected]
    assert [p for _, p in prediction.candidates] == pytest.approx([p for _, p in expected], rel=1e-5)


def test_mask_attention_exclude_hides_masks_and_fills_greedily(tiny_model_dir, tiny_lm):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer(TEXT, return_tensors="pt")["input_ids"]
    hidden = (ids != tokenizer.mask_token_id).long()

    def probs(input_ids, attention_mask):
        with torch.no_grad():
            out = tiny_lm(input_ids=input_ids, attention_mask=attention_mask).logits[0].softmax(-1)
        out[:, tokenizer.all_special_ids] = 0
        return out

    zero_probs, attended_probs = probs(ids, hidden), probs(ids, torch.ones_like(ids))
    assert not torch.equal(zero_probs[3], attended_probs[3])
    (first, second), (filling,) = predict(tiny_lm, tokenizer, TEXT, top_k=2, mask_attention="exclude")
    assert [p for _, p in first.candidates] == pytest.approx(zero_probs[3].topk(2).values.tolist(), rel=1e-5)
    # Greedy: fix the more confident mask, rerun with it filled in (and attended), then fill the other.
    pos = 3 if zero_probs[3].max() >= zero_probs[4].max() else 4
    other = 7 - pos
    filled = ids.clone()
    filled[0, pos] = zero_probs[pos].argmax()
    hidden_after = hidden.clone()
    hidden_after[0, pos] = 1
    second_probs = probs(filled, hidden_after)
    filled[0, other] = second_probs[other].argmax()
    word = "".join(tokenizer.convert_ids_to_tokens(filled[0, 3:5].tolist()))
    assert filling.word == word and filling.text == f"北京{word}你！"
    assert filling.probability == pytest.approx(
        zero_probs[pos].max().item() * second_probs[other].max().item()
    )


@pytest.mark.slow
def test_fill_mask_reads_lightning_checkpoints_like_the_export(trained_run, capsys):
    ckpt = next(p for p in (trained_run / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt")
    from_ckpt = run_fill_mask(capsys, "--model", str(ckpt), TEXT, "--mask_attention", "exclude")
    from_export = run_fill_mask(
        capsys, "--model", str(trained_run / "export"), TEXT, "--mask_attention", "exclude"
    )
    assert from_ckpt[1:] == from_export[1:] and len(from_ckpt) > 10


def test_an_unknown_mask_attention_value_is_one_line_naming_the_accepted_ones(tiny_model_dir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fill-mask", "--model", str(tiny_model_dir), TEXT, "--mask_attention", "hide"])
    assert exit_info.value.code == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert line.startswith('mlm_adapt: error: Parser key "mask_attention":')
    assert "'attend', 'exclude'" in line and "hide" in line


def test_predict_refuses_an_unknown_mode(tiny_model_dir, tiny_lm):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(ValueError, match="mask_attention='hide': use one of attend, exclude"):
        predict(tiny_lm, tokenizer, TEXT, mask_attention="hide")


def test_text_without_mask_is_a_one_line_error(tiny_model_dir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fill-mask", "--model", str(tiny_model_dir), "北京欢迎你"])
    assert exit_info.value.code == 2
    assert "TEXT has no [MASK]" in capsys.readouterr().err


def _texts_by_length(tokenizer, lengths: range) -> dict[int, str]:
    """A text with one mask for each token count in ``lengths`` that some text of repeated characters hits."""
    found: dict[int, str] = {}
    for repeat in range(lengths.stop + 4):
        text = "好" * repeat + tokenizer.mask_token
        found.setdefault(len(tokenizer(text, verbose=False)["input_ids"]), text)
    return {n: found[n] for n in lengths if n in found}


@pytest.mark.parametrize("family", ["bert", "xlmr"])
def test_texts_around_the_position_limit_run_or_are_one_line(family, capsys):
    """RoBERTa-style tables count positions after padding_idx: 130 rows hold 128 tokens, not 130."""
    from families import MAX_POSITIONS, family_dir
    from transformers import AutoTokenizer

    model_dir = family_dir(family)
    texts = _texts_by_length(
        AutoTokenizer.from_pretrained(model_dir), range(MAX_POSITIONS - 3, MAX_POSITIONS + 2)
    )
    assert len(texts) >= 4, sorted(texts)
    for length, text in texts.items():
        try:
            main(["fill-mask", "--model", str(model_dir), text])
            code = 0
        except SystemExit as stopped:
            code = stopped.code
        captured = capsys.readouterr()
        if length <= MAX_POSITIONS:
            assert code == 0 and "mask 1" in captured.out, (length, captured.err[-2000:])
        else:
            lines = [line for line in captured.err.splitlines() if line.strip()]
            assert code == 2 and len(lines) == 1, (length, captured.err[-2000:])
            assert lines[0].startswith(f"mlm_adapt: error: TEXT is {length} tokens")
            assert f"at most {MAX_POSITIONS}" in lines[0]
