"""``val/word_accuracy``: a masked word is right only if all its masked tokens are."""

from __future__ import annotations

import pytest
import torch

from mlm_adapt.model.metrics import WordAccuracy, word_keys


def _brute_force(correct: torch.Tensor, word_ids: torch.Tensor, selected: torch.Tensor) -> tuple[int, int]:
    """(right words, masked words), one word at a time."""
    words: dict[tuple[int, int], bool] = {}
    flat = iter(correct.tolist())
    for row in range(word_ids.shape[0]):
        for pos in range(word_ids.shape[1]):
            if selected[row, pos]:
                key = (row, int(word_ids[row, pos]))
                words[key] = words.get(key, True) and next(flat)
    return sum(words.values()), len(words)


def test_word_accuracy_matches_a_per_word_loop():
    gen = torch.Generator().manual_seed(0)
    metric = WordAccuracy()
    expected_correct = expected_total = 0
    for _ in range(3):  # several batches accumulate
        word_ids = torch.sort(torch.randint(0, 12, (4, 30), generator=gen), dim=1).values
        word_ids[:, 0] = -1
        selected = (word_ids >= 0) & (word_ids % 3 == 0)  # whole words selected
        correct = torch.rand(int(selected.sum()), generator=gen) < 0.8
        metric.update(correct, word_keys(word_ids, selected))
        right, n_words = _brute_force(correct, word_ids, selected)
        expected_correct += right
        expected_total += n_words
    assert abs(metric.compute().item() - expected_correct / expected_total) < 1e-6


def test_one_wrong_token_makes_the_word_wrong():
    metric = WordAccuracy()
    word_ids = torch.tensor([[-1, 0, 0, 1, 1, 2, -1], [-1, 0, 0, 1, 1, 2, -1]])
    selected = word_ids >= 0
    #        row 0: w0 right, w1 half wrong, w2 right; row 1 (same word ids, other words): all right
    correct = torch.tensor([1, 1, 1, 0, 1, 1, 1, 1, 1, 1], dtype=torch.bool)
    metric.update(correct, word_keys(word_ids, selected))
    assert metric.compute().item() == pytest.approx(5 / 6)


def test_validation_step_logs_word_accuracy(tiny_model_dir, tokenizer, review_texts):
    from mlm_adapt.masking import WholeWordMaskCollator
    from mlm_adapt.model import MaskedLMModule
    from mlm_adapt.text.alignment import tokenize_with_word_ids
    from mlm_adapt.text.segmentation import JiebaSegmenter

    module = MaskedLMModule(str(tiny_model_dir), max_seq_length=128).eval()
    encoded = tokenize_with_word_ids(review_texts[:8], tokenizer, JiebaSegmenter("rjieba"))
    features = [
        {
            "input_ids": [tokenizer.cls_token_id, *i[:60], tokenizer.sep_token_id],
            "word_ids": [-1, *w[:60], -1],
        }
        for i, w in zip(encoded["input_ids"], encoded["word_ids"], strict=True)
    ]
    batch = WholeWordMaskCollator(tokenizer, mlm_probability=0.3)(features)
    with torch.no_grad():
        module.validation_step(batch, 0)
        logits, labels = module.masked_logits(batch)
    correct = logits.argmax(-1) == labels
    right, n_words = _brute_force(correct, batch["word_ids"], batch["labels"] != -100)
    assert module.word_accuracy["val"].compute().item() == pytest.approx(right / n_words)
