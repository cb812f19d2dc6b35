"""One optimizer step of :class:`MaskedLMModule` over a fixed global batch of 4 rows whose masked counts
differ (1, 6, 2 and 9 tokens), cut into micro-batches and ranks as asked; writes the step's gradients and its
logged ``train/loss``. Run as a script for DDP: Lightning starts the second rank by running it again.

    python tests/model/step_gradients.py MODEL_DIR OUT_FILE BATCH_SIZE ACCUMULATION DEVICES
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch

MASKED_COUNTS = (1, 6, 2, 9)
LENGTHS = (16, 12, 10, 16)  # real tokens of each row; the rest is padding
SEQ_LEN = 16


class GlobalBatch(torch.utils.data.Dataset):
    """The 4 rows; under DDP, Lightning's ``DistributedSampler`` deals rows 0, 2 to rank 0, 1, 3 to rank 1."""

    def __init__(self, vocab_size: int):
        generator = torch.Generator().manual_seed(0)
        self.rows = []
        for masked, length in zip(MASKED_COUNTS, LENGTHS, strict=True):
            ids = torch.randint(5, vocab_size, (SEQ_LEN,), generator=generator)
            attention = (torch.arange(SEQ_LEN) < length).long()
            ids[length:] = 0
            labels = torch.full((SEQ_LEN,), -100)
            positions = torch.randperm(length - 2, generator=generator)[:masked] + 1
            labels[positions] = ids[positions]
            ids[positions] = 4  # [MASK]
            self.rows.append({"input_ids": ids, "attention_mask": attention, "labels": labels})

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.rows[index]


class KeepGradients(L.Callback):
    """After the step's optimizer step (gradients stay until the next step zeroes them): saves them."""

    def __init__(self, out_file: Path):
        self.out_file = out_file

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches or trainer.global_rank:
            return
        grads = {
            name: p.grad.detach().clone() for name, p in pl_module.named_parameters() if p.grad is not None
        }
        torch.save({"grads": grads, "loss": float(trainer.callback_metrics["train/loss"])}, self.out_file)


def one_step(model_dir: str, out_file: Path, batch_size: int, accumulation: int, devices: int) -> None:
    from mlm_adapt.model import MaskedLMModule

    module = MaskedLMModule(
        model_dir,
        max_seq_length=SEQ_LEN,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.0),
        warmup=0,
    )
    data = GlobalBatch(module.model.config.vocab_size)
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_steps=1,
        accumulate_grad_batches=accumulation,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[KeepGradients(out_file)],
    )
    trainer.fit(module, train_dataloaders=loader)


if __name__ == "__main__":
    model_dir, out_file, batch_size, accumulation, devices = sys.argv[1:]
    one_step(model_dir, Path(out_file), int(batch_size), int(accumulation), int(devices))
