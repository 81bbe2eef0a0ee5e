"""Goodput over time: a fleet's held and useful seconds per time bucket, per group, from the jobs' splits
(``orchestrator.core.goodput``). Pure: the dashboard's fleet chart draws it."""

from __future__ import annotations

import math
from collections.abc import Iterable

from orchestrator.core.goodput import Category, JobSplit


def held_over_time(jobs: Iterable[JobSplit], key: str, start: float, end: float,
                   width: float) -> dict[str, list[tuple[float, float]]]:
    """Per group (``key``: partition or sweep), the (held, useful) seconds in each ``width``-second bucket from
    ``start`` (the last one ends at or after ``end``). An attempt's useful share is spread evenly over its held
    intervals: the split says how much of an attempt was useful, not when (a save stall at its end counts a little
    in each of its buckets). Held time outside ``[start, end)`` is left out."""
    n = max(1, math.ceil((end - start) / width))
    out: dict[str, list[list[float]]] = {}
    for j in jobs:
        group = j.group.get(key)
        if group is None:
            continue
        buckets = out.setdefault(group, [[0.0, 0.0] for _ in range(n)])
        for a in j.attempts:
            if not a.held_s > 0:
                continue
            share = a.seconds.get(Category.USEFUL, 0.0) / a.held_s
            for s, e in a.holds:
                if not (math.isfinite(s) and math.isfinite(e)):  # a time no clock wrote: counted nowhere
                    continue
                s, e = max(s, start), min(e, end)
                b = int((s - start) // width)
                while s < e and b < n:
                    upto = min(e, start + (b + 1) * width)
                    buckets[b][0] += upto - s
                    buckets[b][1] += (upto - s) * share
                    s, b = upto, b + 1
    return {g: [(h, u) for h, u in bs] for g, bs in sorted(out.items())}
