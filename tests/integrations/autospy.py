"""A spy on an AutoSaveInterval: when each save was allowed and ended, to check saves wait one interval."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator import protocol
from orchestrator.kit.interval import AutoSaveInterval, daly_interval


def spy(auto: AutoSaveInterval) -> list[tuple[str, float, float]]:
    """Record ("due", time, interval then) for each due() that said yes and ("saved", time, interval after)."""
    events: list[tuple[str, float, float]] = []
    due, record = auto.due, auto.record_save

    def spied_due() -> bool:
        ok = due()
        if ok:
            events.append(("due", time.monotonic(), auto.interval_s))
        return ok

    def spied_record(*a: float) -> None:
        record(*a)
        events.append(("saved", time.monotonic(), auto.interval_s))

    auto.due, auto.record_save = spied_due, spied_record  # type: ignore[method-assign]
    return events


def assert_saves_one_interval_apart(events: list[tuple[str, float, float]], max_steps: int) -> None:
    """Every save after the first began at least one interval (the one in force) after the previous ended,
    and the loop saved more than twice but not at every step. Load-independent: times are the spy's own."""
    saves = [e for e in events if e[0] == "saved"]
    assert 3 <= len(saves) < max_steps, events
    last_end, interval = None, 0.0
    for kind, t, iv in events:
        if kind == "due" and last_end is not None:
            assert t - last_end >= interval - 1e-6, (t - last_end, interval)
        if kind == "saved":
            last_end, interval = t, iv


def assert_auto_saves(run_dir: Path, events: list[tuple[str, float, float]], max_steps: int, mtbf_s: float) -> None:
    """An integration's ``auto`` run (same checks for each framework): every heartbeat reports the MTBF orch handed
    it and Daly's interval for the save cost it measured; the first step saves (to measure the cost); one
    verified checkpoint per save the spy saw, plus the final step's; saves one interval apart."""
    beats = [b for b in protocol.read_progress_history(run_dir, 1) if "save_cost_s" in b]
    assert beats and all(b["mtbf_s"] == mtbf_s for b in beats)
    last = beats[-1]
    assert last["save_interval_s"] == pytest.approx(max(0.25, daly_interval(last["save_cost_s"], mtbf_s)), rel=1e-6)
    saved = [s for s, _ in protocol.verified_checkpoints(run_dir)]
    assert min(saved) == 1  # the first save measures the cost
    periodic = len([e for e in events if e[0] == "saved"])
    # The final step's save (before completion is recorded) is not an interval's save: one more, at max_steps.
    assert len(saved) == periodic or (len(saved) == periodic + 1 and max(saved) == max_steps), (saved, periodic)
    assert_saves_one_interval_apart(events, max_steps)
