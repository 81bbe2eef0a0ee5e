"""Helpers of the multi-rank launch tests, local and Slurm: a tiny gloo DDP program under orch's kit.

The program (``rank_program``) is started by orch once per rank (``--nproc-per-node``). Each rank records the
torchrun environment it got and every step it completed (``<log dir>/env-<attempt>-<rank>.json``,
``steps-<rank>.log``), so a test sees all ranks, and any step redone after a stop, from outside.
"""

from __future__ import annotations

import json
from pathlib import Path

import psutil

from orchestrator import protocol

TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

PROGRAM = '''
import argparse, json, os, time
import torch
import torch.distributed as dist
from torch import nn
from orchestrator.integrations.loop import orch_run

ap = argparse.ArgumentParser()
ap.add_argument("--max-steps", type=int, default=60)
ap.add_argument("--sleep", type=float, default=0.05)
ap.add_argument("--log-dir", required=True)
a = ap.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
env = {k: os.environ.get(k) for k in KEYS}
env.update(pid=os.getpid(), sid=os.getsid(0), world=dist.get_world_size(), host=os.uname().nodename)
with open(os.path.join(a.log_dir, f"env-{os.environ['ORCH_ATTEMPT']}-{rank}.json"), "w") as f:
    json.dump(env, f)
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with orch_run(model, opt, save_every=20) as run:
    for step in run.steps(a.max_steps):
        x = torch.randn(8, 4)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(a.sleep)
        with open(os.path.join(a.log_dir, f"steps-{rank}.log"), "a") as f:
            f.write(f"{os.environ['ORCH_ATTEMPT']} {step}\\n")
        run.log(loss=loss.item())
dist.destroy_process_group()
'''.replace("KEYS", repr(TORCHRUN_ENV))


def rank_program(tmp: Path) -> Path:
    path = tmp / "rank_program.py"
    path.write_text(PROGRAM)
    return path


def rank_envs(log_dir: Path, attempt: int) -> dict[int, dict]:
    out = {}
    for p in log_dir.glob(f"env-{attempt}-*.json"):
        try:
            out[int(p.stem.rsplit("-", 1)[1])] = json.loads(p.read_text())
        except (ValueError, OSError):
            continue  # being written
    return out


def steps_done(log_dir: Path, rank: int) -> list[tuple[int, int]]:
    """(attempt, step) for every step rank ``rank`` completed, in order."""
    p = log_dir / f"steps-{rank}.log"
    if not p.exists():
        return []
    return [tuple(map(int, ln.split())) for ln in p.read_text().splitlines() if ln.strip()]  # type: ignore[misc]


def token_carriers(token: str) -> list[psutil.Process]:
    """Live processes whose environment carries the attempt's token (the job's, wherever their session)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(protocol.ENV_TOKEN) == token:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def cmdline_of(procs: list[psutil.Process], needle: str) -> list[str] | None:
    for p in procs:
        try:
            argv = p.cmdline()
        except psutil.Error:
            continue
        if needle in argv:
            return argv
    return None




GLOO_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
