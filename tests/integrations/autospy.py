"""A spy on an AutoSaveInterval: when each save was allowed and ended, to check saves wait one interval."""

from __future__ import annotations

import time

from orchestrator.kit.interval import AutoSaveInterval


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
