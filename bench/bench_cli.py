#!/usr/bin/env python3
"""P2: login-node latency of read commands.

``orch status`` with 100 jobs against ``python -c "import sqlalchemy.orm, click"`` (the floor any
SQLAlchemy + click CLI pays), measured alternately in the same run, median of >= 7 each; goal <= 1.5x.
Also ``orch status --json`` and ``orch show``, and the modules each imports: read commands must not
import torch, submitit, alembic or numpy. ``python -X importtime``'s top offenders are printed (and
written to BENCHMARKS.md) so a miss comes with its profile.

Usage: ``.venv/bin/python bench/bench_cli.py [--runs N] [--jobs N] [--no-write]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common as C  # noqa: E402

HEAVY = ("torch", "submitit", "alembic", "numpy")
BASELINE = [C.PY, "-c", "import sqlalchemy.orm, click"]
GOAL = 1.5


def populate(home: Path, n: int) -> None:
    """``n`` jobs through the real submit path (in-process: it forks real local attempts), one pass."""
    os.environ["ORCH_HOME"] = str(home)
    from orchestrator.config import load_config
    from orchestrator.db import Database
    from orchestrator.reconcile import reconcile_pass
    from orchestrator.submit import SubmitRequest, submit

    cfg = load_config()
    db = Database(cfg)
    for i in range(n):
        # A third finish with a verified marker, a third exit 0 without one, a third keep running.
        if i % 3 == 0:
            cmd, outputs = ["sh", "-c", "mkdir -p result && echo ok > result/out.txt"], ["result/*"]
        elif i % 3 == 1:
            cmd, outputs = ["true"], []
        else:
            cmd, outputs = ["sleep", "600"], []
        submit(db, cfg, SubmitRequest(name=f"job-{i:03d}", command=cmd, outputs=outputs))
    import time

    from orchestrator.protocol import verify_done_marker

    deadline = time.time() + 60
    while not verify_done_marker(cfg.runs_root / "job-000").verified and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    reconcile_pass(db, cfg)
    db.engine.dispose()


def kill_sleepers(home: Path) -> None:
    import json

    for w in home.glob("runs/*/attempts/*/wrapper.json"):
        try:
            os.killpg(json.loads(w.read_text())["pid"], 9)
        except (OSError, ValueError, KeyError):
            pass


def imported(argv: list[str], env: dict) -> tuple[set[str], list[tuple[int, int, str]]]:
    """Top-level modules imported by ``argv`` and the (self us, cumulative us, module) list."""
    p = subprocess.run(argv, capture_output=True, text=True, env={**env, "PYTHONPROFILEIMPORTTIME": "1"},
                       timeout=120)
    rows = []
    for line in p.stderr.splitlines():
        parts = line[len("import time:"):].split("|")
        if line.startswith("import time:") and len(parts) == 3 and parts[0].strip().isdigit():
            rows.append((int(parts[0]), int(parts[1]), parts[2].rstrip()))
    return {r[2].strip().split(".")[0] for r in rows}, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="orch-bench-cli-"))
    orch = [C.ORCH] if Path(C.ORCH).exists() else [C.PY, "-m", "orchestrator.cli"]
    try:
        populate(home, args.jobs)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
        env["ORCH_HOME"] = str(home)
        cmds = {
            "orch status": [*orch, "status"],
            "orch status --json": [*orch, "status", "--json"],
            "orch show job-001": [*orch, "show", "job-001"],
            "orch verify job-000": [*orch, "verify", "job-000"],
            "baseline: python -c \"import sqlalchemy.orm, click\"": BASELINE,
            "python -c pass (interpreter start)": [C.PY, "-c", "pass"],
        }
        for argv in cmds.values():  # warm the page cache and .pyc files
            subprocess.run(argv, capture_output=True, env=env, check=False)
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(args.runs):  # alternate, so drift on a shared machine hits every command alike
            for k, argv in cmds.items():
                rc, wall, _rss, out, err = C.child_run(argv, env=env)
                assert rc == 0, (k, err[-500:])
                times[k].append(wall)
        n_rows = sum(1 for ln in subprocess.run([*orch, "status"], capture_output=True, text=True,
                                               env=env).stdout.splitlines()[1:] if ln.strip())
        base_times = times["baseline: python -c \"import sqlalchemy.orm, click\""]
        base = C.stats(base_times)[0]
        ratio = C.stats(times["orch status"])[0] / base
        min_ratio = min(times["orch status"]) / min(base_times)  # least disturbed by other load
        heavy = {}
        for k in ("orch status", "orch status --json", "orch show job-001", "orch verify job-000"):
            mods, rows = imported(cmds[k], env)
            heavy[k] = sorted(mods & set(HEAVY))
            if k == "orch status":
                status_rows, n_mods = rows, len(mods)
        base_mods, _ = imported(BASELINE, env)
    finally:
        kill_sleepers(home)
        shutil.rmtree(home, ignore_errors=True)

    rows = []
    for k, ts in times.items():
        r = C.stats(ts)[0] / base
        goal = ""
        if k == "orch status":
            goal = f"<= {GOAL}x " + ("✅" if r <= GOAL else "❌")
        if k in heavy:
            goal += ("; " if goal else "") + ("imports " + ", ".join(heavy[k]) + " ❌" if heavy[k]
                                               else "no torch/submitit/alembic/numpy ✅")
        rows.append([k, C.fmt(ts, digits=0), f"{r:.2f}x", goal])
    tbl = C.table(["command", f"wall, median (min–max) of {args.runs}", "vs baseline", "goal"], rows)
    own = sorted((r for r in status_rows if r[2].strip().split(".")[0] not in base_mods), key=lambda r: -r[0])
    top = sorted(status_rows, key=lambda r: -r[0])[:10]
    prof = C.table(["self ms", "cumulative ms", "module"],
                   [[f"{s / 1e3:.1f}", f"{c / 1e3:.1f}", m.strip()] for s, c, m in top])
    own_ms = sum(r[0] for r in own) / 1e3
    print(f"P2 orch status ({n_rows} jobs) / import baseline = {ratio:.2f} (goal <= {GOAL}); "
          f"ratio of the fastest runs {min_ratio:.2f}")
    print(tbl)
    print("\n`python -X importtime` of `orch status`, top 10 by self time:\n" + prof)
    notes = (f"{n_rows} jobs in the DB (a third verified, a third exit-0-without-marker, a third running), "
             f"every command measured as a fresh process, alternating with the baseline. Ratio of medians "
             f"{ratio:.2f} (the goal's measure); ratio of the fastest run of each {min_ratio:.2f} (the one least "
             f"disturbed by other load on a shared machine). `orch status` imports "
             f"{n_mods} top-level modules; those the baseline does not import cost {own_ms:.1f} ms of self "
             f"time in all ({', '.join(sorted({r[2].strip().split('.')[0] for r in own}))}).")
    body = (C.preamble("bench_cli.py", notes) + "\n" + tbl
            + "\n\n`python -X importtime` of `orch status`, top 10 modules by self time:\n\n" + prof)
    if not args.no_write:
        C.replace_section("CLI latency (P2)", body)
    return 0 if ratio <= GOAL and not any(heavy.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
