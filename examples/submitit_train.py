#!/usr/bin/env python3
"""submitit code under orch: the lines marked ``# orch`` are all that change.

    .venv/bin/python examples/submitit_train.py --backend local --max-steps 300
    .venv/bin/python examples/submitit_train.py --backend slurm --partition spot

``TrainLoop`` is an ordinary ``submitit.helpers.Checkpointable``: its state (model, optimizer, step) lives in
the object, and the inherited ``checkpoint()`` returns ``DelayedSubmission(self, ...)``, i.e. the object as it
is now. Under orch that pickle is committed as a verified checkpoint at the next ``safe_point()`` after a
SIGTERM; without the ``safe_point`` line (``--no-safe-point``) submitit's semantics apply: ``checkpoint()`` runs
inside the signal handler, wherever the loop was.

Batches are drawn from a generator seeded by the step, so a resumed run sees the same data as an uninterrupted
one. Test knobs: ``step_log`` (each optimizer update appends ``<attempt> <step>`` once applied: an update
applied twice shows up twice), ``sleep_per_step`` (time to send a signal mid-run), ``pause_after_update``
(sleep once, between the optimizer update of that step and the step counter: where an in-handler
checkpoint tears the state).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import submitit
import torch
from torch import nn

from orchestrator.integrations.submitit import OrchExecutor, safe_point  # orch


class TrainLoop(submitit.helpers.Checkpointable):
    def __init__(self, max_steps: int, *, step_log: str | None = None, sleep_per_step: float = 0.0,
                 use_safe_point: bool = True, pause_after_update: int | None = None, pause_file: str | None = None,
                 fail_at: int | None = None) -> None:
        self.max_steps = max_steps
        self.step_log = step_log
        self.sleep_per_step = sleep_per_step
        self.use_safe_point = use_safe_point
        self.pause_after_update, self.pause_file = pause_after_update, pause_file
        self.fail_at = fail_at
        self.step = 0
        self.model: nn.Module | None = None
        self.opt: torch.optim.Optimizer | None = None

    def __call__(self) -> dict:
        torch.set_num_threads(1)
        if self.model is None:
            torch.manual_seed(0)
            self.model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        if self.use_safe_point:
            safe_point(self.step)  # orch (optional): from here on, checkpoint() is only called at a safe point
        loss = torch.tensor(0.0)
        for step in range(self.step + 1, self.max_steps + 1):
            g = torch.Generator().manual_seed(1000 + step)
            x = torch.randn(32, 16, generator=g)
            y = torch.randint(0, 4, (32,), generator=g)
            loss = nn.functional.cross_entropy(self.model(x), y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self._log(step)
            if step == self.fail_at:
                raise ValueError(f"boom at step {step}")
            if step == self.pause_after_update and self.pause_file and not os.path.exists(self.pause_file):
                Path(self.pause_file).touch()
                time.sleep(60)  # an evaluation, a logging call, an all-reduce: the update is applied, not counted
            self.step = step
            time.sleep(self.sleep_per_step)
            if self.use_safe_point:
                safe_point(step, loss=loss.item())  # orch (optional): a consistent state after each step
        return {"steps": self.step, "loss": loss.item(), "state_dict": self.model.state_dict()}

    def _log(self, step: int) -> None:
        if self.step_log:
            with open(self.step_log, "a") as f:
                f.write(f"{os.environ.get('ORCH_ATTEMPT', '1')} {step}\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["local", "slurm"], default="local")
    ap.add_argument("--partition", default=None)
    ap.add_argument("--max-steps", type=int, default=300)
    ap.add_argument("--no-safe-point", action="store_true")
    a = ap.parse_args()
    executor = OrchExecutor(folder="submitit-logs", backend=a.backend)  # orch (was: submitit.AutoExecutor(...))
    executor.update_parameters(name="submitit-train", timeout_min=60, mem_gb=2, cpus_per_task=1,
                               slurm_partition=a.partition)
    job = executor.submit(TrainLoop(a.max_steps, use_safe_point=not a.no_safe_point, sleep_per_step=0.02))
    print(f"submitted {job.job_id}; run dir {job.run_dir}", flush=True)
    out = job.result()  # waits: reconcile passes requeue a preempted attempt
    print(f"{job.job_id}: {job.state}, {out['steps']} steps, loss {out['loss']:.4f}")


if __name__ == "__main__":
    main()
