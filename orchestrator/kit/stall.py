"""Seconds the training loop was blocked saving checkpoints, cumulative for this process (stdlib only).

orch's goodput accounting (orchestrator/core/goodput.py) subtracts this from the step spans it sees in the
heartbeat history: the heartbeat records it as ``save_stall_s``, relative to the heartbeat's creation (one
attempt). Only the caller's blocked time counts: a background save's writer thread is not a stall, its
snapshot and the wait for the previous save are. Google's goodput tooling subtracts the blocking save time
the same way (UNPRODUCTIVE_CHECKPOINT_SAVE_TIME); see ../shared/notes/goodput.md.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

_lock = threading.Lock()
_total = 0.0
_inside = threading.local()  # nested blocked sections (save() calls wait()) count once


def total() -> float:
    """Seconds blocked saving so far in this process."""
    with _lock:
        return _total


def add(seconds: float) -> None:
    """Count ``seconds`` of blocked saving measured by the caller (a framework's own save, e.g. HF's)."""
    global _total
    if seconds > 0:
        with _lock:
            _total += seconds


@contextlib.contextmanager
def blocked_saving() -> Iterator[None]:
    """Time the enclosed code as blocked saving (the outermost section of each thread only)."""
    if getattr(_inside, "depth", 0):
        _inside.depth += 1
        try:
            yield
        finally:
            _inside.depth -= 1
        return
    _inside.depth = 1
    t0 = time.monotonic()
    try:
        yield
    finally:
        _inside.depth = 0
        add(time.monotonic() - t0)
