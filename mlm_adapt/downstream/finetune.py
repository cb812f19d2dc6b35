"""The ``finetune`` method: a short full fine-tune of a COPY of the current weights, per seed.

The masked LM's encoder weights are copied into a fresh model of the task type's ``auto_model`` class
(``AutoModelFor{Sequence,Token}Classification``) built from the same config (the classification head,
and BERT's pooler that a masked LM lacks, start from a seeded random init).
The model being adapted is never touched.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, get_linear_schedule_with_warmup

from mlm_adapt.downstream.features import Encoding, Place, batches, encoder_of
from mlm_adapt.downstream.types import TaskType
from mlm_adapt.errors import MLMAdaptError


def classifier_copy(model: PreTrainedModel, kind: TaskType, label_names: list[str]) -> PreTrainedModel:
    """A model of the task type's head class with ``model``'s encoder weights (copied) and a new head."""
    config = copy.deepcopy(model.config)
    kind.configure(config, label_names)
    auto = kind.auto_model
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
    encoding: Encoding,
    index: list[int],
    tokenizer: PreTrainedTokenizerBase,
    kind: TaskType,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    batch = tokenizer.pad([encoding.rows[i] for i in index], return_tensors="pt")
    batch = {k: v for k, v in batch.items() if k != "special_tokens_mask"}
    batch["labels"] = kind.batch_labels(encoding, index, batch["input_ids"].shape[1])
    return {k: v.to(device) for k, v in batch.items()}


def finetune(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train: Encoding,
    kind: TaskType,
    label_names: list[str],
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    forward_context: Callable[[], AbstractContextManager] | None = None,
    advance: Callable[[int], None] | None = None,
) -> PreTrainedModel:
    """Fine-tunes a copy of ``model`` for ``steps`` AdamW steps (linear decay, 10% warmup) and returns it.

    The copy's head init, dropout and batch order all follow ``seed`` (batches are drawn from a seeded
    permutation of the training rows, reshuffled at each pass). ``advance(1)`` follows each step.
    """
    torch.manual_seed(seed)
    classifier = classifier_copy(model, kind, label_names).train()
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
                loss = classifier(**_collate(train, index, tokenizer, kind, device)).loss
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            if advance is not None:
                advance(1)
    return classifier.eval()


@torch.no_grad()
def predict(
    classifier: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    test: Encoding,
    kind: TaskType,
    batch_size: int,
    forward_context: Callable[[], AbstractContextManager] | None = None,
    advance: Callable[[int], None] | None = None,
) -> tuple[torch.Tensor, list[Place]]:
    """The type's prediction for every unit the rows place (in batch order), with its ``(example, unit)``."""
    device = next(classifier.parameters()).device
    preds, placed = [], []
    for index, batch in batches(test, tokenizer, batch_size, device):
        inputs = {k: v for k, v in batch.items() if k != "special_tokens_mask"}
        with forward_context() if forward_context else nullcontext():
            logits = classifier(**inputs).logits
        preds.append(kind.predictions(logits, test, index).cpu())
        placed.extend(p for i in index for p in test.placed[i])
        if advance is not None:
            advance(len(index))
    return torch.cat(preds), placed
