"""What a distributed run will do, said once at the start: world size, global batch, tokens per step."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override


class GlobalBatchInfo(L.Callback):
    """Logs the effective global batch size and tokens per optimizer step when training starts.

    ``global batch = data.batch_size x trainer.accumulate_grad_batches x world size`` (devices x nodes);
    ``tokens per step = global batch x max_seq_length`` (exact with packing, an upper bound without).
    Both go to the console (rank 0) and to every logger as metrics at step 0.
    """

    def __init__(self):
        self.info: dict[str, int] = {}

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        hparams = getattr(trainer.datamodule, "hparams", {})
        batch_size = int(hparams.get("batch_size", 0))
        max_seq_length = int(hparams.get("max_seq_length", 0))
        global_batch = batch_size * trainer.accumulate_grad_batches * trainer.world_size
        self.info = {
            "world_size": trainer.world_size,
            "num_nodes": trainer.num_nodes,
            "per_device_batch_size": batch_size,
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "global_batch_size": global_batch,
            "tokens_per_step": global_batch * max_seq_length,
        }
        rank_zero_info(
            f"mlm_adapt scale: {trainer.world_size} process(es) on {trainer.num_nodes} node(s) "
            f"({type(trainer.strategy).__name__}); global batch {global_batch} = {batch_size} per device x "
            f"{trainer.accumulate_grad_batches} accumulation x {trainer.world_size}; "
            f"tokens per step {global_batch * max_seq_length:,}"
        )
        for logger in trainer.loggers:
            logger.log_metrics(
                {f"scale/{k}": float(v) for k, v in self.info.items()}, step=trainer.global_step
            )
