"""What the trainer's in-process OOM recovery needs to know: is this error an allocation failure, and which smaller
micro-batch still cuts the batch evenly.
"""

from __future__ import annotations

import torch


def is_oom(e: BaseException) -> bool:
    """CUDA OOM, or a CPU allocation failure (PyTorch raises a plain RuntimeError for those)."""
    if isinstance(e, torch.OutOfMemoryError):
        return True
    msg = str(e)
    return isinstance(e, RuntimeError) and (
        "DefaultCPUAllocator" in msg or "can't allocate memory" in msg or "failed to allocate" in msg.lower())


def largest_divisor_at_most(n: int, limit: int) -> int:
    """The micro-batch after an OOM halves the limit: the largest that still divides the batch evenly."""
    return max(d for d in range(1, max(limit, 1) + 1) if n % d == 0)
