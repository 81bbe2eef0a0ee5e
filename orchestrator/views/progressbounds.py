"""The range a heartbeat's numbers must lie in before a display computes with them (stdlib only).

``protocol.clean_progress`` already keeps only finite numbers and ints in [0, 2**63). That is a valid
record, not a plausible measurement: a job that wrote ``loss: 1e308``, ``time: -1e308`` or a step near
2**63 made ``orch watch`` and ``submit --wait`` exit 1 (an ETA of inf seconds: OverflowError) and
``orch plot`` exit 1 (matplotlib's LinAlgError over an axis of 2e308). ``plausible`` keeps each field
that a display can use and drops the others, one field at a time: the rest of the heartbeat still shows.
``orch watch``, ``orch plot`` and ``orch status`` read heartbeats through it.
"""

from __future__ import annotations

import math
from typing import Any

MAX_MEASURE = 1e100  # |loss|, |lr|, grad norm beyond this are no measurement (and overflow an axis)
MAX_RATE = 1e15  # tokens per second
MAX_STEP = 2**53  # steps, exact as floats (matplotlib, rich and the ETA compute with floats)
MAX_TIME = 1e11  # a wall-clock time (epoch seconds) later than the year 5000 is no clock's reading

_BOUNDS: dict[str, tuple[float, float]] = {
    "loss": (-MAX_MEASURE, MAX_MEASURE), "eval_loss": (-MAX_MEASURE, MAX_MEASURE),
    "lr": (-MAX_MEASURE, MAX_MEASURE), "grad_norm": (-MAX_MEASURE, MAX_MEASURE),
    "tokens_per_s": (0.0, MAX_RATE), "tokens_per_s_recent": (0.0, MAX_RATE), "tokens_per_s_median": (0.0, MAX_RATE),
    "time": (0.0, MAX_TIME),
    "step": (0, MAX_STEP), "max_steps": (0, MAX_STEP), "saved_step": (0, MAX_STEP), "resumed_from": (0, MAX_STEP),
    "tokens_per_step": (0, MAX_STEP), "samples": (0, MAX_STEP), "epoch": (0, MAX_STEP),
}


def plausible(record: dict[str, Any] | None) -> dict[str, Any]:
    """``record`` (a cleaned heartbeat) without the known numeric fields that lie outside their range."""
    if not record:
        return {}
    out = {}
    for k, v in record.items():
        bounds = _BOUNDS.get(k)
        if bounds is None or in_range(v, *bounds):
            out[k] = v
    return out


def in_range(v: Any, lo: float, hi: float) -> bool:
    """A finite int or float (not a bool) within [lo, hi]."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    if isinstance(v, float) and not math.isfinite(v):
        return False
    return lo <= v <= hi
