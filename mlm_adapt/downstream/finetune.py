"""The ``finetune`` method: a short full fine-tune of a COPY of the current weights, per seed.

The masked LM's encoder weights are copied into a fresh ``AutoModelFor{Sequence,Token}Classification``
built from the same config (the classification head, and BERT's pooler that a masked LM lacks, start from
a seeded random init). The model being adapted is never touched.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    get_linear_schedule_with_warmup,
)

from mlm_adapt.downstream.features import IGNORE, Encoding, batches, encoder_of
from mlm_adapt.errors import MLMAdaptError


def classifier_copy(model: PreTrainedModel, label_names: list[str], token_level: bool) -> PreTrainedModel:
    """A classification model with ``model``'s encoder weights (copied) and a new head."""
    config = copy.deepcopy(model.config)
    config.num_labels = len(label_names)
    config.id2label = dict(enumerate(label_names))
    config.label2id = {name: i for i, name in enumerate(label_names)}
    auto = AutoModelForTokenClassification if token_level else AutoModelForSequenceClassification
    try:
        classifier = auto.from_config(config)
    except ValueError as exc:
        raise MLMAdaptError(
            f"downstream.method=finetune: {config.model_type!r} has no {auto.__name__[12:]} class; "
            "use method: linear_probe"
        ) from exc
    source = encoder_of(model).state_dict()
    missing, unexpected = encoder_of(classifier).load_state_dict(source, strict=False)
    # Only layers a masked LM does not have (BERT's pooler) may stay randomly initialized.
    if unexpected or any(not k.startswith("pooler.") for k in missing):
        raise MLMAdaptError(
            "downstream.method=finetune: the encoder weights do not fit the classification model "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]}); use method: linear_probe"
        )
    param = next(model.parameters())
    return classifier.to(device=param.device, dtype=param.dtype)


def _collate(
    encoding: Encoding, index: list[int], tokenizer: PreTrainedTokenizerBase, device: torch.device
) -> dict[str, torch.Tensor]:
    batch = tokenizer.pad([encoding.rows[i] for i in index], return_tensors="pt")
    batch = {k: v for k, v in batch.items() if k != "special_tokens_mask"}
    if encoding.token_level:  # pad the per-token labels
        width = batch["input_ids"].shape[1]
        labels = torch.full((len(index), width), IGNORE)
        for row, i in enumerate(index):
            labels[row, : len(encoding.targets[i])] = torch.tensor(encoding.targets[i])
    else:
        labels = torch.tensor([encoding.targets[i] for i in index])
    batch["labels"] = labels
    return {k: v.to(device) for k, v in batch.items()}


def finetune(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train: Encoding,
    label_names: list[str],
    token_level: bool,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    forward_context: Callable[[], AbstractContextManager] | None = None,
) -> PreTrainedModel:
    """Fine-tunes a copy of ``model`` for ``steps`` AdamW steps (linear decay, 10% warmup) and returns it.

    The copy's head init, dropout and batch order all follow ``seed`` (batches are drawn from a seeded
    permutation of the training rows, reshuffled at each pass).
    """
    torch.manual_seed(seed)
    classifier = classifier_copy(model, label_names, token_level).train()
    device = next(classifier.parameters()).device
    optimizer = torch.optim.AdamW(classifier.parameters(), lr=lr, weight_decay=0.01)
    schedule = get_linear_schedule_with_warmup(optimizer, max(steps // 10, 1), steps)
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    with torch.enable_grad():
        for _ in range(steps):
            if len(order) < batch_size:
                order += torch.randperm(len(train), generator=generator).tolist()
            index, order = order[:batch_size], order[batch_size:]
            with forward_context() if forward_context else nullcontext():
                loss = classifier(**_collate(train, index, tokenizer, device)).loss
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
    return classifier.eval()


@torch.no_grad()
def predict(
    classifier: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    test: Encoding,
    batch_size: int,
    forward_context: Callable[[], AbstractContextManager] | None = None,
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Predicted class per example (sequence tasks, in example order) or per labelled token, with the
    ``(example, word)`` of each (token tasks)."""
    device = next(classifier.parameters()).device
    preds: dict[int, torch.Tensor] = {}
    for index, batch in batches(test, tokenizer, batch_size, device):
        inputs = {k: v for k, v in batch.items() if k != "special_tokens_mask"}
        with forward_context() if forward_context else nullcontext():
            logits = classifier(**inputs).logits
        for row, i in enumerate(index):
            if test.token_level:
                keep = torch.tensor(test.targets[i], device=device) != IGNORE
                preds[i] = logits[row, : len(test.targets[i])][keep].argmax(-1).cpu()
            else:
                preds[i] = logits[row].argmax(-1).cpu().reshape(1)
    rows = range(len(test))
    words = [w for i in rows for w in test.words[i]] if test.token_level else []
    return torch.cat([preds[i] for i in rows]), words
