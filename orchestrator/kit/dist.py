"""Ranks: who writes, and how the ranks of a torch.distributed job agree on a stop.

No torch import at module level: ``torch.distributed`` is used only when the program already imported it.
"""

from __future__ import annotations

import os
import sys


def global_rank() -> int:
    """torchrun / Lightning DDP set RANK; srun sets SLURM_PROCID (0 for a batch script)."""
    raw = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"
    return int(raw) if raw.isdigit() else 0


def any_rank(flag: bool) -> bool:
    """True if ``flag`` is true on any rank (no-op without torch.distributed).

    Under ``torchrun`` a signal can reach the ranks at different steps; a checkpoint save is collective,
    so every rank must decide to stop at the same step or the save deadlocks.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    t = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
