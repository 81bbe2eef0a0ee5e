"""A DDP loop with orch_run under torchrun (gloo, CPU): the multi-rank tests' program.

Effective batch ``--global-batch`` on any world size (gradient accumulation); the data position is a
global sample index in ``state`` (so a resume on another world size continues with the same samples).
Each rank appends ``<attempt> <rank> <step> <loss>`` to ``--step-log`` once a step is complete (loss: the
global batch's mean). Faults: ``--fail-save RANK:STEP`` (an OSError, ``--fail-errno`` (ENOSPC), in that rank's
first checkpoint write),
``--kill-at POINT:RANK:STEP`` (SIGKILL of that rank at a commit point), ``--kill-step RANK:STEP`` (SIGKILL
of that rank in the middle of a step), ``--signal-step RANK:STEP`` (SIGTERM from that rank to itself after the step),
``--stop-step RANK:STEP`` (SIGSTOP of that rank by itself once the step is logged, before the kit counts it: a hang),
``--stop-before-beat RANK`` (SIGSTOP of that rank by itself where orch_run starts its heartbeat, after the resume's
collectives: a rank hung before its first beat, as one stuck loading its share of the restore),
``--stop-before-group RANK`` (SIGSTOP of that rank by itself before it imports anything: before orch's kit arms and
its process group forms, as a rank stuck at start would be; the other ranks wait in init_process_group),
``--stop-after-arm RANK`` (SIGSTOP of that rank by itself once orch's kit armed, before its process group forms).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import signal
import sys
import time

if "--stop-before-group" in sys.argv and os.environ.get("ORCH_ATTEMPT", "1") == "1" and \
        os.environ.get("RANK") == sys.argv[sys.argv.index("--stop-before-group") + 1]:
    os.kill(os.getpid(), signal.SIGSTOP)  # hung before its start: it never goes on by itself

import torch
import torch.distributed as dist
from torch import nn

from orchestrator.integrations.loop import orch_run
from orchestrator.kit import heartbeat, sharded
from orchestrator.kit.dist import grad_accumulation

N_SAMPLES = 512


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir")
    ap.add_argument("--max-steps", type=int, default=20)
    ap.add_argument("--save-every", type=lambda v: v if v == "auto" else int(v), default=0, help="steps, or auto")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--sleep-per-step", type=float, default=0.0)
    ap.add_argument("--step-log")
    ap.add_argument("--sharded", action="store_true", help="the sharded format on one rank too")
    ap.add_argument("--fail-save", default="")
    ap.add_argument("--fail-errno", type=int, default=28, help="the errno of --fail-save's OSError (ENOSPC)")
    ap.add_argument("--kill-at", default="")
    ap.add_argument("--kill-step", default="")
    ap.add_argument("--signal-step", default="", help="RANK:STEP: that rank sends itself SIGTERM after the step")
    ap.add_argument("--stop-step", default="", help="RANK:STEP: that rank sends itself SIGSTOP after the step")
    ap.add_argument("--stop-before-beat", type=int, default=None, help="RANK: SIGSTOP before its heartbeat starts")
    ap.add_argument("--stop-before-group", type=int, default=None, help="RANK: SIGSTOP before anything (read above)")
    ap.add_argument("--stop-after-arm", type=int, default=None, help="RANK: SIGSTOP once armed, before its group")
    a = ap.parse_args()
    if a.stop_after_arm is not None and str(a.stop_after_arm) == os.environ.get("RANK") and \
            os.environ.get("ORCH_ATTEMPT", "1") == "1":
        os.kill(os.getpid(), signal.SIGSTOP)  # armed (the kit's import above), hung before its group forms

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        # Bounded collectives: a rank that dies must not leave the others waiting for 30 minutes.
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(N_SAMPLES, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(N_SAMPLES, 1, generator=g)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(a.dropout), nn.Linear(16, 1))
    net: nn.Module = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    state = {"samples": 0}
    accum = grad_accumulation(a.global_batch, a.micro_batch, world)
    attempt = os.environ.get("ORCH_ATTEMPT", "1")

    def fault(spec: str, point: str, step: int) -> bool:
        """Faults fire in attempt 1 only: orch's next attempt must get past them."""
        parts = spec.split(":") if spec and attempt == "1" else []
        return bool(parts) and parts[:-2] == ([point] if point else []) and \
            int(parts[-2]) == rank and int(parts[-1]) == step

    if a.stop_before_beat == rank and attempt == "1":
        real_for_rank = heartbeat.for_rank

        def stop_first(*args: object, **kwargs: object) -> object:
            os.kill(os.getpid(), signal.SIGSTOP)  # hung: it never goes on by itself, nor writes a beat
            return real_for_rank(*args, **kwargs)

        heartbeat.for_rank = stop_first  # orch_run calls heartbeat.for_rank at the end of its __enter__

    with orch_run(net, opt, state=state, save_every=a.save_every or None, keep_last_k=2, run_dir=a.run_dir,
                  sharded=True if a.sharded else None) as run:
        def write_hook(step: int, _path: str) -> None:
            if fault(a.fail_save, "", step):
                raise OSError(a.fail_errno, f"injected: rank {rank} cannot write step {step}")

        def point_hook(point: sharded.CommitPoint, step: int) -> None:
            if fault(a.kill_at, point.value, step):
                os.kill(os.getpid(), signal.SIGKILL)

        run.sckpts.write_hook, run.sckpts.point_hook = write_hook, point_hook
        for step in run.steps(a.max_steps):
            start = state["samples"]
            total = torch.zeros(1)
            for k in range(accum):
                lo = start + (k * world + rank) * a.micro_batch
                idx = torch.arange(lo, lo + a.micro_batch) % N_SAMPLES
                loss = nn.functional.mse_loss(net(x[idx]), y[idx])
                total += loss.detach() * a.micro_batch
                ctx = net.no_sync() if world > 1 and k < accum - 1 else contextlib.nullcontext()
                with ctx:
                    (loss / accum).backward()
            if fault(a.kill_step, "", step):
                os.kill(os.getpid(), signal.SIGKILL)
            opt.step()
            opt.zero_grad()
            state["samples"] = start + a.global_batch
            if world > 1:
                dist.all_reduce(total)
            mean = total.item() / a.global_batch
            run.log(loss=mean)
            if a.step_log:
                with open(a.step_log, "a") as f:
                    f.write(f"{attempt} {rank} {step} {mean!r}\n")
            if fault(a.signal_step, "", step):
                os.kill(os.getpid(), signal.SIGTERM)
            if fault(a.stop_step, "", step):
                os.kill(os.getpid(), signal.SIGSTOP)  # hung: it never goes on by itself
            if a.sleep_per_step:
                time.sleep(a.sleep_per_step)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
