"""The checkpoint interval chosen from the save's cost and the failure rate (``--save-interval auto``,
``orch_run(save_every="auto")``). Stdlib only.

Daly's higher-order optimum (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart
dumps", FGCS 22(3), 2006, eq. 37), with δ the time one checkpoint costs the loop and M the mean time between
failures that lose work::

    τ = √(2δM) · [1 + ⅓·√(δ/2M) + (1/9)·(δ/2M)] − δ     for δ < 2M,  else  τ = M

τ is compute time between the end of one save and the start of the next. Only failures with no warning
count in M (kill -9, node failures, OOM kills): a signalled preemption saves on the signal and needs no
periodic save. orch hands the job M for its backend/partition from the job table (``ORCH_MTBF_S``, see
``orchestrator/decide/mtbf.py``); without it the prior ``PRIOR_MTBF_S`` is used. δ is measured by the job, save by
save: the blocking part (what the loop waits: the whole save when synchronous, the snapshot when in the
background), smoothed, so the interval follows δ as saves get slower or faster. A later attempt starts from
the δ its predecessor's last heartbeat reports; in a first attempt δ is unknown, so the first save comes at
the first step boundary and measures it (CheckFreq profiles first too).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from orchestrator import protocol

ENV_MTBF = "ORCH_MTBF_S"  # set by orch for every attempt: seconds between unsignalled failures
ENV_MTBF_SOURCE = "ORCH_MTBF_SOURCE"  # how orch got it (history or prior), for the job's log
PRIOR_MTBF_S = 24 * 3600.0  # no history: one unwarned failure per day of held time (Daly's own example's M)
MIN_INTERVAL_S = 0.25  # never save more often than this, whatever a tiny δ and M give


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly's optimum compute time between checkpoints (seconds) for save cost ``cost_s`` and MTBF ``mtbf_s``."""
    if not (math.isfinite(cost_s) and math.isfinite(mtbf_s)) or mtbf_s <= 0:
        raise ValueError(f"daly_interval needs a finite cost and a positive MTBF, got {cost_s!r}, {mtbf_s!r}")
    d = max(0.0, cost_s)
    if d >= 2 * mtbf_s:
        return mtbf_s
    r = d / (2 * mtbf_s)
    return math.sqrt(2 * d * mtbf_s) * (1 + math.sqrt(r) / 3 + r / 9) - d


def mtbf_from_env(environ: dict[str, str] | None = None) -> tuple[float, str]:
    """(M, where it came from): ``ORCH_MTBF_S`` when it is a positive finite number, else the prior."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_MTBF, "")
    try:
        m = float(raw)
    except ValueError:
        m = float("nan")
    if math.isfinite(m) and m > 0:
        return m, env.get(ENV_MTBF_SOURCE, "") or "orch"
    return PRIOR_MTBF_S, f"prior {PRIOR_MTBF_S:.0f} s (no {ENV_MTBF})"


class AutoSaveInterval:
    """When to save next: ``due()`` at each step boundary, ``record_save(blocking_s)`` after each save.

    ``clock`` is ``time.monotonic`` (tests pass a virtual one). ``smoothing`` is the weight of the newest save
    in δ's moving average: one slow save moves the interval, a lasting slowdown moves it all the way.
    """

    def __init__(self, mtbf_s: float | None = None, *, smoothing: float = 0.5,
                 min_interval_s: float = MIN_INTERVAL_S, clock=time.monotonic,
                 initial_cost_s: float | None = None) -> None:
        if mtbf_s is None:
            mtbf_s, self.source = mtbf_from_env()
        else:
            self.source = "given"
        self.mtbf_s = float(mtbf_s)
        self.smoothing = smoothing
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.cost_s: float | None = initial_cost_s  # smoothed blocking time of one save
        self.total_s: float | None = None  # smoothed whole save (write + commit), when the caller knows it
        self._last_end: float = clock()
        self.saves = 0

    @classmethod
    def for_run(cls, run_dir: Path | str, attempt: int, **kwargs: object) -> AutoSaveInterval:
        """For attempt ``attempt`` of a run: δ starts at what the latest earlier attempt measured (its last
        heartbeat's ``save_cost_s``), so a restart does not pay an extra save at its first step to measure it
        again (with a 5-minute save: one per failure); the checkpoint it resumed from counts as the last save."""
        return cls(**kwargs).resume_from(run_dir, attempt)  # type: ignore[arg-type]

    def resume_from(self, run_dir: Path | str, attempt: int) -> AutoSaveInterval:
        """Start δ at the latest earlier attempt's measurement (unless known) and the interval now."""
        if self.cost_s is None:
            self.cost_s = previous_cost(run_dir, attempt)
        self._last_end = self.clock()
        return self

    @property
    def interval_s(self) -> float:
        """Compute seconds between saves now (0 before the first save: the first one measures δ)."""
        if self.cost_s is None:
            return 0.0
        return max(self.min_interval_s, daly_interval(self.cost_s, self.mtbf_s))

    def due(self) -> bool:
        """Whether a save is due now: the interval has passed since the last save ended."""
        return self.clock() - self._last_end >= self.interval_s

    def record_save(self, blocking_s: float, total_s: float | None = None) -> None:
        """A save just ended: it blocked the loop ``blocking_s`` (and took ``total_s`` in all)."""
        b = max(0.0, blocking_s)
        self.cost_s = b if self.cost_s is None else (1 - self.smoothing) * self.cost_s + self.smoothing * b
        if total_s is not None:
            t = max(0.0, total_s)
            self.total_s = t if self.total_s is None else (1 - self.smoothing) * self.total_s + self.smoothing * t
        self._last_end = self.clock()
        self.saves += 1

    def fields(self) -> dict[str, float]:
        """What the heartbeat shows: the interval, δ and M the job uses (``orch show``; docs/guides/goodput.md)."""
        out = {"save_interval_s": self.interval_s, "mtbf_s": self.mtbf_s}
        if self.cost_s is not None:
            out["save_cost_s"] = self.cost_s
        if self.total_s is not None:
            out["save_total_s"] = self.total_s
        return out


def previous_cost(run_dir: Path | str, attempt: int) -> float | None:
    """``save_cost_s`` of the latest earlier attempt's last heartbeat that has one (job-written: range-checked)."""
    for n in range(attempt - 1, max(0, attempt - 20), -1):  # a bounded look back
        v = (protocol.read_progress(run_dir, n) or {}).get("save_cost_s")
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
            return float(v)
    return None
