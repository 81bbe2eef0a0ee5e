"""A plain torchrun DDP program: no orch import. It saves and resumes its own checkpoint (``ckpt.pt`` in its
cwd, the run dir under orch), and in attempt 1 (``ORCH_ATTEMPT``) rank ``--rank`` ends on its own at step
``--at``: ``--end kill9`` SIGKILLs itself (a user's kill -9, the OOM killer), ``--end raise`` raises (exit 1).
Each completed step is appended to ``steps-<rank>.log`` as ``<attempt> <step>``.
"""

import argparse
import os
import signal

import torch
import torch.distributed as dist
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--at", type=int, default=7)
ap.add_argument("--rank", type=int, default=1)
ap.add_argument("--end", choices=("kill9", "raise"), required=True)
a = ap.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = int(os.environ.get("ORCH_ATTEMPT", "1"))
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
start = 0
if os.path.exists("ckpt.pt"):
    state = torch.load("ckpt.pt")
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
for step in range(start + 1, a.steps + 1):
    if attempt == 1 and rank == a.rank and step == a.at:
        if a.end == "kill9":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"rank {rank}: injected failure at step {step}")
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0 and step % 3 == 0:
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, "ckpt.tmp")
        os.replace("ckpt.tmp", "ckpt.pt")
    dist.barrier()  # the checkpoint of this step exists before any rank goes on
    with open(f"steps-{rank}.log", "a") as f:
        f.write(f"{attempt} {step}\n")
if rank == 0:
    os.makedirs("result", exist_ok=True)
    torch.save(model.module.state_dict(), "result/model.pt")
dist.destroy_process_group()
