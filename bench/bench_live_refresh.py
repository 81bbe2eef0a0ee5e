#!/usr/bin/env python3
"""Issue 33: what a dashboard page left open costs while jobs run: its live rows' heartbeats on each refresh.

A page refreshes every 15 s; each live row's goodput is split from its attempt's whole heartbeat history (up to
8 MiB). Measured, for 50 live attempts (a page) each with a history of ``--mib`` MiB, after each one appended one
heartbeat: a full read of every history (``goodputview.beats_of``, what each refresh cost before) against the
incremental reader the dashboard keeps (``views.beatcache.BeatCache``, warm: it parsed the histories on the
page's first load). Both answer the same beats (checked each round).

Goal: a refresh reads what was appended, so its cost stops growing with the histories: <= 0.1x the full read.
Usage: ``.venv/bin/python bench/bench_live_refresh.py [--runs N] [--mib M] [--no-write]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common as C

from orchestrator import protocol
from orchestrator.views.beatcache import BeatCache
from orchestrator.views.goodputview import beats_of

TITLE = "A dashboard page left open: its live rows' heartbeats on each refresh (issue 33)"
GOAL = 0.1


def beat(step: int) -> bytes:
    """A heartbeat as the kit writes one (its fields and their size)."""
    return json.dumps({"time": 1.7e9 + step * 10.0, "step": step, "resumed_from": 0, "save_stall_s": 0.25,
                       "saved_step": step - step % 500, "loss": 2.5 / (1 + step), "lr": 3e-4,
                       "tokens_per_s": 51234.5, "samples": step * 32}).encode() + b"\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rows", type=int, default=50)
    ap.add_argument("--mib", type=float, default=1.0)
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    C.add_quick(ap)
    a = ap.parse_args()
    if a.quick:
        a.runs, a.rows, a.mib, a.no_write = 1, 5, 0.1, True
    work = Path(tempfile.mkdtemp(prefix="bench-live-refresh-"))
    try:
        paths, steps = [], []
        per_line = len(beat(1))
        for r in range(a.rows):
            run_dir = work / f"job{r}"
            adir = protocol.attempt_dir(run_dir, 1)
            adir.mkdir(parents=True)
            n = max(1, int(a.mib * (1 << 20) / per_line))
            (adir / protocol.PROGRESS_HISTORY).write_bytes(b"".join(beat(s) for s in range(1, n + 1)))
            paths.append(str(run_dir))
            steps.append(n)
        cache = BeatCache()
        for p in paths:  # the page's first load
            cache.beats(p, 1)
        full: list[float] = []
        incremental: list[float] = []
        for _ in range(a.runs):
            for i, p in enumerate(paths):  # a heartbeat each, as 15 s of training adds
                steps[i] += 1
                with open(protocol.attempt_dir(p, 1) / protocol.PROGRESS_HISTORY, "ab") as f:
                    f.write(beat(steps[i]))
            incremental += C.timeit(lambda: [cache.beats(p, 1) for p in paths], 1, warmup=0)
            full += C.timeit(lambda: [beats_of(p, 1) for p in paths], 1, warmup=0)
            for p in paths:
                if cache.beats(p, 1) != beats_of(p, 1):
                    raise SystemExit(f"the incremental read of {p} differs from the full read")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratio = C.stats(incremental)[0] / C.stats(full)[0]
    rows = [[f"{a.rows} live rows x {a.mib:g} MiB: every history read whole (before)", C.fmt(full), "baseline", ""],
            [f"{a.rows} live rows x {a.mib:g} MiB: the lines appended since the last refresh", C.fmt(incremental),
             f"{ratio:.3f}x", f"<= {GOAL}x" + C.mark(ratio <= GOAL)]]
    tab = C.table(["a refresh's heartbeat reads", "time", "ratio", "goal"], rows)
    print(tab)
    if not a.no_write:
        notes = (f"median (min-max) of {a.runs} refreshes; between two, each history gained one heartbeat. The "
                 "incremental reader's answer equals the full read's each round.")
        C.replace_section(TITLE, C.preamble("bench_live_refresh.py", notes) + "\n" + tab + "\n",
                          after="Fleet views at 100,000 jobs (issue 33)")
        print(f"wrote section '{TITLE}' of {C.BENCHMARKS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
