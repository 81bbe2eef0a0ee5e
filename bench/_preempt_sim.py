"""P7's trace-driven simulation: one long job under Poisson preemptions, two checkpointing strategies.

Why a separate module: bench_preemption.py measures (P4) and this only computes, from those
measurements, what a 24 h job would see; it is also what a reader checks to see what the goodput
columns assume. Nothing here is measured and nothing here imports torch.

The model (machine time = time a machine is held; waiting for a new one is not counted):

* training advances work 1:1 with machine time; a periodic save happens each time the work reaches
  a multiple of ``interval`` (the trainer saves at absolute step multiples, also after a resume) and
  stalls training for ``save_cost`` seconds; its checkpoint counts only once that stall is over;
* preemptions arrive as a Poisson process in machine time (rate ``rate_per_h``), during training,
  during a periodic save or during a restart alike;
* ``periodic``: a job without a SIGTERM handler; SIGTERM's default action ends it at once: it loses
  the work since its last committed checkpoint (a save in progress is lost too);
* ``orch``: the bundled trainer; during training it discards the step in progress (uniform in
  [0, t_step)), saves the last completed step (``term_save`` seconds) and exits; during a periodic
  save it finishes that save (the step is then already saved) and exits. Either only if it fits in
  ``grace``; otherwise it is SIGKILLed at the end of the grace and loses what a periodic-only job loses
  (plus the grace it spent);
* every preemption is followed by a restart of ``restart`` seconds (process start, checkpoint load),
  which a further preemption can interrupt.

Goodput = work / machine time. Both strategies see the same seeded arrival stream.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


def young(cost: float, mtbf: float) -> float:
    """Young (1974): the checkpoint interval that minimises expected waste, first order."""
    return math.sqrt(2.0 * cost * mtbf)


def daly(cost: float, mtbf: float) -> float:
    """Daly (2006), higher-order estimate of the optimum interval (compute time between saves)."""
    if cost >= 2.0 * mtbf:
        return mtbf
    x = cost / (2.0 * mtbf)
    return math.sqrt(2.0 * cost * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - cost


@dataclass(frozen=True)
class Costs:
    """The seconds the simulation is parameterised with (measured, or labelled assumptions)."""

    t_step: float  # one training step: the most work a SIGTERM checkpoint discards
    save_cost: float  # training-visible cost of one periodic save (C)
    term_save: float  # orch: SIGTERM -> exit (the checkpoint of the last completed step)
    restart: float  # process start -> training again (interpreter, imports, checkpoint load)
    grace: float = 30.0  # SIGTERM -> SIGKILL

    def __post_init__(self) -> None:
        # A NaN restart time (a trial that measured no resumed step) made _restart loop for ever: never simulate one.
        for name in ("t_step", "save_cost", "term_save", "restart", "grace"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"Costs.{name} must be a finite number >= 0, not {v!r}")


def simulate(mode: str, rate_per_h: float, seed: int, costs: Costs, interval: float,
             work: float = 24 * 3600.0) -> float:
    """Goodput of one simulated job (``mode``: "orch" or "periodic"); ``interval`` = inf: no periodic saves."""
    assert mode in ("orch", "periodic"), mode
    lam = rate_per_h / 3600.0
    arrivals = random.Random(seed)
    partial = random.Random(seed + 10_000)
    c = costs
    t = done = ckpt = 0.0
    p = arrivals.expovariate(lam)  # absolute machine time of the next preemption
    while done < work - 1e-9:
        boundary = work if math.isinf(interval) else min((math.floor(done / interval + 1e-9) + 1) * interval, work)
        if t + (boundary - done) > p:  # preempted while training
            done += p - t
            t = p
            t, done, ckpt = _preempted(mode, c, t, done, ckpt, None, partial)
            t, p = _restart(c, t, arrivals, lam)
            continue
        t += boundary - done
        done = boundary
        if done >= work - 1e-9:
            break
        if t + c.save_cost > p:  # preempted during a periodic save
            remaining = t + c.save_cost - p
            t = p
            t, done, ckpt = _preempted(mode, c, t, done, ckpt, remaining, partial)
            t, p = _restart(c, t, arrivals, lam)
            continue
        t += c.save_cost
        ckpt = done
        # Whole save cycles that end before the next preemption, in one go (aligned at a boundary now).
        cycle = interval + c.save_cost
        k = min(math.floor((p - t) / cycle), max(0, math.floor((work - done) / interval + 1e-9) - 1))
        if k > 0:
            t += k * cycle
            done += k * interval
            ckpt = done
    return work / t


def _preempted(mode: str, c: Costs, t: float, done: float, ckpt: float, saving: float | None,
               partial: random.Random) -> tuple[float, float, float]:
    """(t, done, ckpt) after a preemption at ``t``; ``saving``: seconds left of a periodic save, or None."""
    if mode == "periodic":
        return t, ckpt, ckpt
    if saving is not None:
        if saving <= c.grace:
            return t + saving, done, done
        return t + c.grace, ckpt, ckpt
    if c.term_save <= c.grace:
        done = max(ckpt, done - partial.uniform(0.0, c.t_step))
        return t + c.term_save, done, done
    return t + c.grace, ckpt, ckpt


def _restart(c: Costs, t: float, arrivals: random.Random, lam: float) -> tuple[float, float]:
    """Restart until one completes before the next preemption; (t after it, time of the next preemption)."""
    while True:
        p = t + arrivals.expovariate(lam)
        if t + c.restart <= p:
            return t + c.restart, p
        t = p
