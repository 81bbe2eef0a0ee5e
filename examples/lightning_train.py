#!/usr/bin/env python3
"""A Lightning training script under orch: the lines marked ``# orch`` are all it takes.

    orch submit --name lit1 -- .venv/bin/python examples/lightning_train.py --max-steps 200
    python examples/lightning_train.py --run-dir /tmp/lit1          # without orch

A tiny character-level MLP language model with dropout; AdamW with a linear warm-up schedule; a
shuffled, resumable train loader (torchdata's ``StatefulDataLoader``: Lightning saves and restores its
position; orch's ``distributed_sampler`` shuffles by seed and epoch, so a mid-epoch resume sees the same
batches, on one process or under DDP) and a validation loader. ``--step-log`` appends
each completed optimizer step (the tests count repeats); ``--sleep-per-step`` stands in for a slower
model; ``--wandb`` adds an offline W&B logger.
"""

from __future__ import annotations

import argparse
import os
import time

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from orchestrator.integrations import lightning as orch  # orch

TEXT = (b"the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. " * 16)
VOCAB, CONTEXT = 64, 16


class TinyLM(L.LightningModule):
    def __init__(self, lr: float, max_steps: int, step_log: str | None, sleep_s: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.emb = nn.Embedding(VOCAB, 32)
        self.mlp = nn.Sequential(nn.Flatten(), nn.Linear(32 * CONTEXT, 64), nn.GELU(), nn.Dropout(0.1),
                                 nn.Linear(64, VOCAB))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.emb(x))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        time.sleep(self.hparams.sleep_s)
        return loss

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        if self.hparams.step_log:
            with open(self.hparams.step_log, "a") as f:
                f.write(f"{os.environ.get('ORCH_ATTEMPT', '1')} {self.global_step}"
                        f"{' ' + os.environ['RANK'] if 'RANK' in os.environ else ''}\n")

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self) -> dict:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}


def loaders(batch_size: int) -> tuple[StatefulDataLoader, StatefulDataLoader]:
    data = torch.tensor(list(TEXT)) % VOCAB
    starts = torch.arange(len(data) - CONTEXT - 1)
    x = torch.stack([data[i:i + CONTEXT] for i in starts])
    ds = TensorDataset(x, data[starts + CONTEXT])
    val = TensorDataset(x[:64], data[starts[:64] + CONTEXT])
    # orch's sampler: the same batches after a resume, under DDP too (a plain shuffle=True is exact on one process)
    train = StatefulDataLoader(ds, batch_size=batch_size, sampler=orch.distributed_sampler(ds))  # orch
    return train, StatefulDataLoader(val, batch_size=64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--val-every", type=int, default=50)
    ap.add_argument("--save-every", type=int, default=0, help="periodic checkpoints (0: only on a signal)")
    ap.add_argument("--run-dir", default=None, help="without orch (orch sets ORCH_RUN_DIR)")
    ap.add_argument("--step-log", default=None)
    ap.add_argument("--sleep-per-step", type=float, default=0.0)
    ap.add_argument("--export", action="store_true", help="write result/export.txt after training")
    ap.add_argument("--fail-after-train", action="store_true", help="raise after training (a failed export): a crash")
    ap.add_argument("--wandb", action="store_true", help="also log to W&B (set WANDB_MODE=offline to stay local)")
    ap.add_argument("--mlflow", action="store_true", help="also log to MLflow (set MLFLOW_TRACKING_URI)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    train, val = loaders(a.batch_size)
    model = TinyLM(3e-3, a.max_steps, a.step_log, a.sleep_per_step)
    loggers = [orch.tensorboard_logger(a.run_dir)]  # orch (optional: one TensorBoard dir for every attempt)
    if a.wandb:
        from lightning.pytorch.loggers import WandbLogger

        loggers.append(WandbLogger(project="orch-examples", save_dir="."))
    if a.mlflow:  # MLFLOW_TRACKING_URI set: the job's one MLflow run, which every attempt continues
        loggers.append(orch.mlflow_logger())
    # Under torchrun (`orch submit --nproc-per-node K`), one process per rank: DDP over the ranks torchrun started.
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    trainer = L.Trainer(max_steps=a.max_steps, val_check_interval=a.val_every, check_val_every_n_epoch=None,
                        log_every_n_steps=1, logger=loggers, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, accelerator="cpu", deterministic=True, devices=ranks,
                        strategy="ddp" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "auto",
                        callbacks=[orch.OrchCallback(every_n_steps=a.save_every or None, run_dir=a.run_dir)])  # orch
    trainer.fit(model, train, val, ckpt_path=orch.resume_path(a.run_dir))  # orch
    after_training(a, os.path.join(a.run_dir or ".", "result"))


def after_training(a: argparse.Namespace, result_dir: str) -> None:
    """What a script does once training ended: an export into result/ (listed in done.json), or a failure."""
    if a.fail_after_train:
        raise RuntimeError("export failed after training (--fail-after-train)")
    if a.export:
        os.makedirs(result_dir, exist_ok=True)
        with open(os.path.join(result_dir, "export.txt"), "w") as f:
            f.write("exported after training\n")


if __name__ == "__main__":
    main()
