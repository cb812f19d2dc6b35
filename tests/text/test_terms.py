"""Domain vocabulary: OOV characters, candidate jieba terms, new tokens with mean-of-pieces embeddings."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from mlm_adapt.model.loading import extend_embeddings
from mlm_adapt.text.tokenizer import candidate_terms, cohesion, oov_characters, write_user_dict


def test_oov_characters_and_unk_rate(tokenizer):
    vocab = tokenizer.get_vocab()
    rare = next(ch for ch in "龘靐齉爩麤" if ch not in vocab)
    oov, unk, total = oov_characters(["好评" + rare * 3, rare + "不错"], tokenizer)
    assert oov == {rare: 4}
    assert (unk, total) == (4, 8)


def test_candidate_terms_are_cohesive_hmm_words_missing_from_the_dictionary(tmp_path, review_texts):
    texts = [*review_texts, *["这款骁龙芯片的手机很流畅，骁龙芯片发热小"] * 3]
    terms = candidate_terms(texts, min_count=3)
    assert terms["骁龙"] == 6
    assert "手机" not in terms  # in jieba's dictionary
    assert not candidate_terms(texts, min_count=3, min_cohesion=float("inf"))
    write_user_dict(terms, tmp_path / "dict.txt")
    known = candidate_terms(texts, user_dict=str(tmp_path / "dict.txt"), min_count=3)
    assert "骁龙" not in known  # a user dictionary's words count as known


def test_cohesion_separates_terms_from_chance_pairs():
    corpus = "标间很好。" * 20 + "这本书是好书。" * 50 + "这是" * 3 + "标" + "间"
    assert cohesion("标间", corpus) > 3 > cohesion("这是", corpus)


def test_new_tokens_start_from_the_mean_of_their_pieces_and_stay_tied(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForMaskedLM.from_pretrained(tiny_model_dir)
    old = model.get_input_embeddings().weight.detach().clone()
    old_bias = model.get_output_embeddings().bias.detach().clone()
    vocab = tokenizer.get_vocab()
    term = next(t for t in ("好评", "物流", "质量") if t not in vocab)
    rare = next(ch for ch in "龘靐齉爩麤" if ch not in vocab)
    pieces = tokenizer(term, add_special_tokens=False)["input_ids"]
    added = extend_embeddings(model, tokenizer, [term, rare, "好"])  # "好" is already in the vocabulary
    assert added == [term, rare]
    weight = model.get_input_embeddings().weight
    assert weight.shape[0] == len(old) + 2 == len(tokenizer)
    assert torch.equal(weight[: len(old)], old)
    assert torch.allclose(weight[len(old)], old[pieces].mean(0))
    assert torch.allclose(weight[len(old) + 1], old[tokenizer.unk_token_id])
    assert model.get_output_embeddings().weight.data_ptr() == weight.data_ptr()  # decoder still tied
    assert torch.allclose(model.get_output_embeddings().bias[len(old)], old_bias[pieces].mean(0))
    assert tokenizer(term, add_special_tokens=False)["input_ids"] == [len(old)]


def test_new_tokens_file_reaches_model_and_data_through_the_cli(tiny_model_dir, corpus_file, tmp_path):
    from mlm_adapt.cli.fit import MLMAdaptCLI

    tokens = tmp_path / "new_tokens.txt"
    tokens.write_text("龘\n好评如潮\n", encoding="utf-8")
    cli = MLMAdaptCLI(
        args=[
            f"--model.model_name_or_path={tiny_model_dir}",
            "--model.max_seq_length=64",
            f"--model.new_tokens_file={tokens}",
            f"--data.train_files=[{corpus_file}]",
            "--trainer.logger=false",
        ],
        run=False,
    )
    tokenizer = cli.datamodule.tokenizer
    assert len(tokenizer) == cli.model.model.config.vocab_size
    ids = tokenizer("好评如潮龘", add_special_tokens=False)["input_ids"]
    assert ids == [len(tokenizer) - 1, len(tokenizer) - 2]


@pytest.mark.slow
def test_new_tokens_survive_fit_and_both_exports(tiny_model_dir, corpus_file, tmp_path):
    from conftest import tiny_fit_args

    from mlm_adapt.cli import main

    tokens = tmp_path / "new_tokens.txt"
    tokens.write_text("好评如潮\n龘\n", encoding="utf-8")
    root = tmp_path / "run"
    main(["fit", *tiny_fit_args(tiny_model_dir, corpus_file, root, f"--model.new_tokens_file={tokens}")])
    (ckpt,) = root.rglob("*.ckpt")
    main(["export", f"--ckpt_path={ckpt}", f"--output_dir={tmp_path / 'from_ckpt'}"])
    (fit_export,) = {p.parent for p in root.rglob("model.safetensors")}
    for directory in (fit_export, tmp_path / "from_ckpt"):
        tokenizer = AutoTokenizer.from_pretrained(directory)
        model = AutoModelForMaskedLM.from_pretrained(directory)
        assert len(tokenizer) == model.config.vocab_size == model.get_input_embeddings().weight.shape[0]
        assert tokenizer("好评如潮", add_special_tokens=False)["input_ids"] == [len(tokenizer) - 2]


@pytest.mark.slow
def test_fill_mask_on_a_checkpoint_trained_with_new_tokens(tiny_model_dir, corpus_file, tmp_path, capsys):
    """The checkpoint's tokenizer includes its new tokens (a smaller one would not fit the resized model)."""
    from conftest import tiny_fit_args

    from mlm_adapt.cli import main
    from mlm_adapt.cli.fill_mask import load_for_inference

    tokens = tmp_path / "new_tokens.txt"
    tokens.write_text("好评如潮\n龘\n", encoding="utf-8")
    root = tmp_path / "run"
    main(["fit", *tiny_fit_args(tiny_model_dir, corpus_file, root, f"--model.new_tokens_file={tokens}")])
    (ckpt,) = root.rglob("*.ckpt")
    model, tokenizer = load_for_inference(str(ckpt))
    assert len(tokenizer) == model.get_input_embeddings().weight.shape[0]
    assert tokenizer("好评如潮", add_special_tokens=False)["input_ids"] == [len(tokenizer) - 2]
    main(["fill-mask", "好评[MASK][MASK]，龘", f"--model={ckpt}"])
    assert "mask 2" in capsys.readouterr().out
