"""Ranks: who writes, and how the ranks of a torch.distributed job agree on a stop.

No torch import at module level: ``torch.distributed`` is used only when the program already imported it.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, Protocol

ENV_STOP_CHECK_S = "ORCH_STOP_CHECK_S"  # the longest time between two stop agreements (seconds, default 1)
ENV_GRACE_S = "ORCH_GRACE_S"  # the job's grace from the stop signal to SIGKILL, when the launcher exports it
DEFAULT_STOP_CHECK_S = 1.0
# The agreement may cost at most 1 % of the step time: aim at half of it, the rest is the margin for noise in the
# measured step and all-reduce times (aimed at 1 %, bench P10 measured 1.04-1.07 %).
AGREEMENT_SHARE = 0.005


def global_rank() -> int:
    """torchrun / Lightning DDP set RANK; srun sets SLURM_PROCID (0 for a batch script)."""
    raw = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"
    return int(raw) if raw.isdigit() else 0


def _dist() -> Any | None:
    """``torch.distributed`` when the program initialised a process group of more than one rank, else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    return dist


def world_size() -> int:
    dist = _dist()
    return dist.get_world_size() if dist is not None else 1


def rank() -> int:
    """This rank in the initialised process group (0 without one)."""
    dist = _dist()
    return dist.get_rank() if dist is not None else 0


def barrier() -> None:
    """Wait for every rank (no-op on one rank); bounded by the process group's timeout.

    An all-reduce of one of the kit's own tensors, not ``dist.barrier()``: gloo's barrier keeps every
    collective still in flight when it started (the program's own all-reduces too) until the barrier is
    itself freed, on a worker thread, often as the program exits; freeing a tensor Python created there
    during interpreter finalization aborts the rank (see ``settle``). An all-reduce holds only its tensor,
    and ``settle`` waits until that is let go.
    """
    dist = _dist()
    if dist is None:
        return
    t = _buffer(dist, 1)
    t.zero_()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    del t  # settle counts the references to the buffer: this frame's is not the backend's
    settle()


def _device(dist: Any) -> Any:
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None


_BUFFERS: dict[tuple[str, int], Any] = {}
_BASE_REFS = 2


def _buffer(dist: Any, n: int) -> Any:
    """A process-lifetime int64 tensor of ``n`` elements on the collective's device, reused by every agreement.

    One tensor, not one per call, so that ``settle`` can see when the collective backend let go of it.
    """
    import torch

    device = _device(dist)
    key = (str(device), n)
    buf = _BUFFERS.get(key)
    if buf is None:
        buf = _BUFFERS[key] = torch.zeros(n, dtype=torch.int64, device=device)
    return buf


SETTLE_TIMEOUT_S = 10.0


def settle(timeout_s: float = SETTLE_TIMEOUT_S) -> bool:
    """Wait until the collective backend's threads hold none of the agreements' tensors (bounded).

    gloo's worker thread drops a finished collective a moment after ``wait()`` returned, and a barrier keeps
    the collectives still in flight when it started until it is itself dropped. Dropping the last C++
    reference to a tensor Python created takes the GIL; when that falls into interpreter finalization, the
    rank aborts ("terminate called without an active exception", SIGABRT) after its run completed (CI,
    stop 17: 1 run in 15 of a 3-rank resume, the thread freeing the exit barrier that held the stop
    agreement's all-reduce). Called after the kit's barrier and when the kit's run ends; the condition is
    the tensors' reference counts, polled with the GIL released between checks. Returns False on timeout.
    """
    deadline = time.monotonic() + timeout_s
    # getrefcount(_BUFFERS[key]): the dict's reference and the call's argument, nothing else once released
    while any(sys.getrefcount(_BUFFERS[key]) > _BASE_REFS for key in list(_BUFFERS)):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def any_rank(flag: bool) -> bool:
    """True if ``flag`` is true on any rank (no-op without torch.distributed).

    Under ``torchrun`` a signal can reach the ranks at different steps; a checkpoint save is collective,
    so every rank must decide to stop at the same step or the save deadlocks.
    """
    dist = _dist()
    if dist is None:
        return flag
    t = _buffer(dist, 1)
    t.fill_(1 if flag else 0)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def max_check_interval_s(environ: dict[str, str] | None = None) -> float:
    """How long a stop may wait for the next agreement: ``ORCH_STOP_CHECK_S`` (default 1 s), and never more
    than a tenth of the grace (``ORCH_GRACE_S``) when the launcher exports it: the save must still fit."""
    env = os.environ if environ is None else environ
    limit = DEFAULT_STOP_CHECK_S
    for key, scale in ((ENV_STOP_CHECK_S, 1.0), (ENV_GRACE_S, 0.1)):
        try:
            v = float(env.get(key, "") or "nan") * scale
        except ValueError:
            continue
        if math.isfinite(v) and v > 0:
            limit = min(limit, v) if key == ENV_GRACE_S else v
    return limit


class _Flag(Protocol):
    @property
    def requested(self) -> bool: ...


class StopAgreement:
    """One stop decision for all ranks, taken at step boundaries, at a bounded cost.

    The signal handler only sets a flag (``PreemptionFlag``); every rank calls :meth:`should_stop` at every
    step boundary, and at the boundaries where the ranks *check*, one all-reduce MAX of two ints decides:
    ``[stop, -proposed_interval]``. So every rank stops after the same step, however many ranks saw the
    signal (Megatron's dist_signal_handler; Lightning #20806: ranks that decide alone deadlock in the next
    collective). The second int makes the next check interval N the smallest any rank proposed, the same on
    every rank: each proposes N so that the measured agreement costs at most ``share`` of its step time
    (a 2 ms all-reduce every 5 ms step would otherwise cost 40 %), and never more steps than
    ``max_interval_s`` of step time (the stop must still fit in the grace).
    docs/decisions/0005-one-stop-for-all-ranks.md says why.
    """

    def __init__(self, flag: _Flag, *, share: float = AGREEMENT_SHARE, max_interval_s: float | None = None) -> None:
        self.flag = flag
        self.share = share
        self.max_interval_s = max_check_interval_s() if max_interval_s is None else max_interval_s
        self.every = 1  # steps between two agreements: agreed by all ranks at each agreement
        self.signum: int | None = None  # the highest signal number any rank saw, once a stop is agreed
        self.agreements = 0
        self.agreement_s = 0.0  # total time spent in agreements
        self.boundaries = 0
        self._since = 0
        self._last: float | None = None  # monotonic time of the previous boundary
        self._step_s: float | None = None  # EMA of a step's time, agreements excluded
        self._cost_s: float | None = None  # EMA of one agreement's time

    @property
    def overhead(self) -> float:
        """Agreement time as a share of the time between the first and the last boundary."""
        total = self.agreement_s + (self._step_s or 0.0) * max(0, self.boundaries - 1)
        return self.agreement_s / total if total > 0 else 0.0

    def _proposal(self) -> int:
        if not self._step_s or not self._cost_s:
            return 1
        by_cost = math.ceil(self._cost_s / (self.share * self._step_s))
        by_grace = max(1, math.floor(self.max_interval_s / self._step_s))
        return max(1, min(by_cost, by_grace, 1_000_000))

    def should_stop(self) -> bool:
        """Call at every step boundary on every rank: True on every rank at the same boundary, or on none."""
        now = time.monotonic()
        if self._last is not None:
            dt = now - self._last
            self._step_s = dt if self._step_s is None else 0.8 * self._step_s + 0.2 * dt
        self.boundaries += 1
        dist = _dist()
        if dist is None:
            self._last = time.monotonic()
            return self.flag.requested
        self._since += 1
        if self._since < self.every:
            self._last = time.monotonic()
            return False
        return self.agree(now)

    def agree(self, now: float | None = None) -> bool:
        """Agree now (every rank must call it at the same point): at evaluation batch boundaries too."""
        dist = _dist()
        if dist is None:
            return self.flag.requested
        t0 = time.monotonic()
        # The signal number, not just a bit: a rank that saw none still reports which stop it acts on.
        signum = getattr(self.flag, "signum", None)
        code = (signum or 1) if self.flag.requested else 0
        t = _buffer(dist, 2)
        t[0], t[1] = code, -self._proposal()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        code, every = int(t[0].item()), int(-t[1].item())
        stop = code > 0
        if code > 1:
            self.signum = code
        cost = time.monotonic() - t0
        self._cost_s = cost if self._cost_s is None else 0.8 * self._cost_s + 0.2 * cost
        self.agreements += 1
        self.agreement_s += cost
        self.every, self._since = max(1, every), 0
        self._last = time.monotonic()
        return stop


def grad_accumulation(global_batch: int, micro_batch: int, world: int | None = None) -> int:
    """Micro-batches per optimizer step on each rank so that the effective batch stays ``global_batch`` on
    any world size (a resume on fewer ranks accumulates more); refuses a split that would change it."""
    world = world_size() if world is None else world
    per_step = micro_batch * world
    if global_batch % per_step:
        raise ValueError(f"global batch {global_batch} is not a multiple of micro batch {micro_batch} x "
                         f"{world} rank(s)")
    return global_batch // per_step


# What gloo/NCCL/the c10d store say when a peer rank is gone (killed, its node lost) or stopped answering.
_LOST_PEER_MARKS = ("connection closed by peer", "connection reset by peer", "broken pipe", "timed out",
                    "communicator was aborted", "socket timeout", "connection refused")


def lost_peer(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a collective that failed because another rank went away, not this rank's own error.

    A rank kill -9'd made the survivor's all-reduce raise "Connection closed by peer"; recorded as the
    survivor's ``crash`` (not auto-requeued) it hid that the attempt was killed.
    """
    if exc is None:
        return False
    dist = sys.modules.get("torch.distributed")
    dist_error = getattr(dist, "DistError", None) if dist is not None else None
    if dist_error is not None and isinstance(exc, dist_error) and not isinstance(exc, ValueError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(m in text for m in _LOST_PEER_MARKS)
