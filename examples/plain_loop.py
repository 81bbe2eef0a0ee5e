#!/usr/bin/env python3
"""A plain PyTorch training loop under orch: the lines marked ``# orch`` are all it takes.

    orch submit --name loop1 -- .venv/bin/python examples/plain_loop.py --max-steps 300
    orch submit --name loop2 --nproc-per-node 2 -- .venv/bin/python examples/plain_loop.py   # DDP over 2 ranks
    python examples/plain_loop.py --run-dir /tmp/loop1          # without orch

A tiny character-level MLP language model with dropout, AdamW and a cosine LR schedule; batches are
drawn nanoGPT-style from the global torch RNG, so an exact resume needs the RNG restored too (orch
restores it). ``--step-log`` appends each completed optimizer step (the tests count repeats);
``--sleep-per-step`` stands in for a slower model (the tests and the benchmark use it to have time to
send a signal mid-run). Under torchrun (``--nproc-per-node``) it is DDP over gloo: each rank draws its own
batches (its RNG seeded with its rank), and orch_run saves every rank's part of each checkpoint.
"""

from __future__ import annotations

import argparse
import atexit
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from orchestrator.integrations.loop import orch_run  # orch

TEXT = (b"the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. " * 64)
VOCAB, CONTEXT = 64, 16


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.mlp = nn.Sequential(nn.Flatten(), nn.Linear(32 * CONTEXT, 64), nn.GELU(), nn.Dropout(0.1),
                                 nn.Linear(64, VOCAB))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.emb(x))


def get_batch(data: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - CONTEXT - 1, (batch_size,))
    x = torch.stack([data[i:i + CONTEXT] for i in ix])
    return x, data[ix + CONTEXT]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0, help="each rank's batches are drawn with seed + its rank")
    ap.add_argument("--run-dir", default=None, help="without orch (orch sets ORCH_RUN_DIR)")
    ap.add_argument("--step-log", default=None)
    ap.add_argument("--sleep-per-step", type=float, default=0.0)
    ap.add_argument("--export", action="store_true", help="write result/export.txt after training")
    ap.add_argument("--fail-after-train", action="store_true", help="raise after training (a failed export): a crash")
    ap.add_argument("--wandb", action="store_true", help="also log to W&B (set WANDB_MODE=offline to stay local)")
    ap.add_argument("--tensorboard", action="store_true", help="also log the loss to the run's TensorBoard dir")
    ap.add_argument("--mlflow", action="store_true", help="also log to MLflow (set MLFLOW_TRACKING_URI)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # started by torchrun: orch submit --nproc-per-node K
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(a.seed + rank)  # each rank its own batches; DDP gives every rank rank 0's initial weights
    data = torch.tensor(list(TEXT)) % VOCAB
    model: nn.Module = TinyLM()
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a.max_steps)
    step_log = open(a.step_log, "a") if a.step_log else None

    with orch_run(model, opt, sched, save_every=a.save_every, run_dir=a.run_dir) as run:  # orch
        # orch (optional): a failing tracker call costs no stop its checkpoint
        track = run.tolerant(wandb_log(a.wandb and rank == 0))  # orch
        board = tensorboard_log(str(run.tensorboard_dir) if a.tensorboard and rank == 0 else None)
        metric = run.tolerant(mlflow_log(a.mlflow and rank == 0))  # orch continues one MLflow run per job
        for step in run.steps(a.max_steps):  # orch (was: for step in range(1, a.max_steps + 1))
            x, y = get_batch(data, a.batch_size)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            run.log(loss=loss.item())  # orch (optional: shows the loss in orch status)
            time.sleep(a.sleep_per_step)
            track({"loss": loss.item()}, step=step)
            board("loss", loss.item(), step)
            metric("loss", loss.item(), step=step)
            if step_log:
                step_log.write(f"{os.environ.get('ORCH_ATTEMPT', '1')} {step}{f' {rank}' if world > 1 else ''}\n")
                step_log.flush()
    if rank == 0:
        after_training(a, str(run.result_dir))
    if world > 1:
        dist.destroy_process_group()


def wandb_log(on: bool):
    """``wandb.log`` of a run that continues across attempts (orch sets WANDB_RUN_ID), or a no-op."""
    if not on:
        return lambda *_a, **_k: None
    import wandb

    return wandb.init(project="orch-examples").log


def mlflow_log(on: bool):
    """``mlflow.log_metric`` of the run ``mlflow.start_run()`` opens (under orch: the job's one run), or a no-op."""
    if not on:
        return lambda *_a, **_k: None
    import mlflow

    mlflow.start_run()  # ended at exit (mlflow's atexit hook); orch marks the job's end
    return mlflow.log_metric


def tensorboard_log(log_dir: str | None):
    """``add_scalar`` of a writer in the run's TensorBoard dir (one curve for every attempt), or a no-op."""
    if log_dir is None:
        return lambda *_a, **_k: None
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir, flush_secs=1)
    atexit.register(writer.close)  # a stop exits through SystemExit: the last points are written too
    return writer.add_scalar


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
