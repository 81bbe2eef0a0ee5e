#!/usr/bin/env python3
"""P1: one reconciler pass must cost O(live jobs), never O(history).

What it measures (one run, every ratio against a baseline in the same run):

1. A SQLite DB with 10,000 live jobs and 1,000,000 finished ones (bulk-inserted with ``executemany``
   on the raw sqlite3 connection, after Alembic created the schema; cached under
   ``/tmp/orch-bench/`` between runs, keyed by the schema head) vs. the same 10,000 live jobs with
   10,000 finished ones. A fake backend answers every poll instantly with "running". Reported: one
   pass's time EXCLUDING the backend call, the number of backend calls (must be 1), the
   1M-history / 10k-history ratio (goal <= 1.2), and the SQL statements a pass issued.
2. The real local backend at 1,000 live jobs: 1,000 real sleeping processes (so the backend really
   reads each session from /proc: session id, start ticks, namespaces), a steady pass (nothing changed:
   no write beyond the lease's take and release), then a pass
   in which all 1,000 ended with a verified ``done.json`` and a wrapper ``exit.json``.
3. Peak RSS (``ru_maxrss`` from ``wait4``) of a real ``orch reconcile`` subprocess at 10,000 live
   local jobs (all pointing at one real sleeping process, so every poll answers "running"), next to
   the RSS of ``python -c "import sqlalchemy.orm, click"``.

Usage: ``.venv/bin/python bench/bench_reconcile.py [--runs N] [--history N] [--live N] [--no-write]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common as C
from sqlalchemy import event

from orchestrator import protocol
from orchestrator.backends.base import AttemptRef, Backend, Outcome, Phase, SubmitSpec
from orchestrator.backends.local import LocalBackend, format_id
from orchestrator.core.config import load_config
from orchestrator.core.db import SCHEMA_HEAD, Database
from orchestrator.jobside import proctable
from orchestrator.ops.reconcile import reconcile_pass

CACHE = Path(os.environ.get("ORCH_BENCH_CACHE", "/tmp/orch-bench"))
GEN_VERSION = 3  # bump when the generated content changes
TS = "2026-11-01 12:00:00.000000"
HIST_STATES = (("done_marker_verified", "succeeded", None), ("failed", "failed", "crash"),
               ("cancelled", "cancelled", "cancelled"))


# ------------------------------------------------------------------------------------------------
# DB generation
# ------------------------------------------------------------------------------------------------
def _cfg(home: Path):
    os.environ["ORCH_HOME"] = str(home)
    os.environ.pop("ORCH_DB_URL", None)
    return load_config(home)


def generate(path: Path, live: int, history: int, runs_root: Path, external_id: str | None = None,
             live_state: str = "running") -> None:
    """Create ``path`` at the schema head (Alembic) and bulk-insert jobs, attempts and events.

    History: ``history`` finished jobs (done 90 %, failed 5 %, cancelled 5 %), one attempt and two
    events each. Live: ``live`` jobs in ``live_state`` with one attempt in the same state, whose
    external id is ``external_id`` (default: a pid that does not exist).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="gen-", dir=path.parent))
    try:
        cfg = _cfg(home)
        cfg.db_url = f"sqlite:///{path}"
        Database(cfg).engine.dispose()  # Alembic upgrade to head: the schema is born the real way
        con = sqlite3.connect(path, isolation_level=None)
        con.execute("PRAGMA synchronous=OFF")
        con.execute("PRAGMA cache_size=-262144")
        con.execute("BEGIN")

        def jobs():
            for i in range(history):
                st = HIST_STATES[0][0] if i % 20 < 18 else HIST_STATES[1 + i % 2][0]
                yield (i + 1, f"hist-{i:07d}", st, "local", f"{runs_root}/hist-{i:07d}",
                       '["python", "-m", "orch_trainer", "--preset", "tiny"]', "{}", "[]", 3, "{}", None, TS, TS)
            for k in range(live):
                yield (history + k + 1, f"live-{k:05d}", live_state, "local", f"{runs_root}/live-{k:05d}",
                       '["python", "-m", "orch_trainer", "--preset", "tiny"]', "{}", "[]", 3, "{}", None, TS, TS)

        def attempts():
            for i in range(history):
                _js, ast, fc = HIST_STATES[0] if i % 20 < 18 else HIST_STATES[1 + i % 2]
                yield (i + 1, i + 1, 1, f"h{i:015x}", ast, "local", f"{1000000 + i}:1", None,
                       0 if ast == "succeeded" else 1, fc, None, None, None, "{}", None, 1, 0, TS, TS, TS, TS)
            for k in range(live):
                yield (history + k + 1, history + k + 1, 1, f"l{k:015x}", live_state, "local",
                       external_id or f"{4000000 + k}:1", None, None, None, None, None, None, "{}", None, 1, 0,
                       TS, TS if live_state == "running" else None, None, TS)

        def events():
            eid = 0
            for i in range(history):
                for frm, to in (("pending", "submitted"), ("submitted", HIST_STATES[0][0] if i % 20 < 18
                                                           else HIST_STATES[1 + i % 2][0])):
                    eid += 1
                    yield (eid, i + 1, TS, frm, to, "generated history")

        con.executemany("INSERT INTO jobs (id, name, state, backend, run_dir, command_json, resources_json, "
                        "outputs_json, max_attempts, overrides_json, retry_not_before, created_at, updated_at) "
                        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", jobs())
        con.executemany("INSERT INTO attempts (id, job_id, n, token, state, backend, external_id, backend_state, "
                        "exit_code, failure_class, failure_step, detail, action_json, overrides_json, plan_json, "
                        "counted, restarts, submitted_at, started_at, ended_at, created_at) "
                        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", attempts())
        con.executemany("INSERT INTO events (id, job_id, at, from_state, to_state, reason) VALUES (?,?,?,?,?,?)",
                        events())
        # The history as the reconcile passes leave it (migration 0014): every ended attempt settled, its tally in the
        # running totals (no generated attempt follows a preemption: nothing redone; the failure classes counted).
        con.execute("UPDATE attempts SET redone_sum = 0, redone_count = 0, redone_unmeasured = 0 "
                    "WHERE ended_at IS NOT NULL")
        con.execute("INSERT INTO fleet_tallies (name, value) SELECT 'failures/' || failure_class, count(*) "
                    "FROM attempts WHERE ended_at IS NOT NULL AND failure_class IS NOT NULL GROUP BY failure_class")
        con.execute("COMMIT")
        con.execute("ANALYZE")
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.close()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def cached_db(live: int, history: int, runs_root: Path) -> Path:
    """The generated DB for (live, history), from the cache when present (content-keyed name)."""
    p = CACHE / f"reconcile-h{history}-l{live}-s{SCHEMA_HEAD}-g{GEN_VERSION}.db"
    if not p.exists():
        t0 = time.perf_counter()
        tmp = p.with_name(p.name + f".tmp-{os.getpid()}")
        generate(tmp, live, history, runs_root)
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(str(tmp) + suffix)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp.with_suffix(".migrate.lock"))  # ensure_schema's lock file, named after the DB
        os.replace(tmp, p)
        print(f"  generated {p.name} ({p.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.0f} s",
              flush=True)
    return p


# ------------------------------------------------------------------------------------------------
# backends
# ------------------------------------------------------------------------------------------------
class InstantBackend(Backend):
    """Answers every poll at once with "running"; counts calls and the time spent inside them."""

    name = "local"

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0

    def poll(self, refs: Sequence[AttemptRef]) -> dict[str, Outcome]:
        t0 = time.perf_counter()
        self.calls += 1
        running = Outcome(Phase.RUNNING)
        out = {r.token: running for r in refs}
        self.seconds += time.perf_counter() - t0
        return out

    def find_by_token(self, refs: Sequence[AttemptRef]) -> dict[str, str]:
        self.calls += 1
        return {}

    def submit(self, spec: SubmitSpec) -> str:
        raise AssertionError("the bench never submits")

    def cancel(self, refs: Sequence[AttemptRef]) -> None:
        raise AssertionError("the bench never cancels")


class TimedLocal(LocalBackend):
    """The real local backend, with the time inside its calls recorded."""

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0

    def poll(self, refs: Sequence[AttemptRef]) -> dict[str, Outcome]:
        t0 = time.perf_counter()
        self.calls += 1
        try:
            return super().poll(refs)
        finally:
            self.seconds += time.perf_counter() - t0


class SqlCounter:
    """Counts statements on an engine, split into reads and writes (INSERT/UPDATE/DELETE)."""

    def __init__(self, engine) -> None:
        self.reads = self.writes = self.begins_immediate = 0
        event.listen(engine, "before_cursor_execute", self._on)

    def _on(self, _conn, _cur, statement: str, *_a) -> None:
        s = statement.lstrip().upper()
        if s.startswith(("INSERT", "UPDATE", "DELETE")):
            self.writes += 1
        elif s.startswith("BEGIN IMMEDIATE"):
            self.begins_immediate += 1
        else:
            self.reads += 1

    def reset(self) -> None:
        self.reads = self.writes = self.begins_immediate = 0


def _changed_rows(path: Path) -> tuple[int, int, int]:
    """Rows of the tables a pass may change, except the lease: (jobs, attempts, events)."""
    con = sqlite3.connect(path)
    try:
        return tuple(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("jobs", "attempts", "events"))
    finally:
        con.close()


class FakeSetup:
    """One generated DB copied into its own ORCH_HOME, opened, with a statement counter."""

    def __init__(self, live: int, history: int, work: Path) -> None:
        self.src = cached_db(live, history, work / "runs")
        home = work / f"home-fake-{history}"
        home.mkdir(parents=True)
        self.path = home / "orch.db"
        shutil.copyfile(self.src, self.path)
        self.cfg = _cfg(home)
        self.db = Database(self.cfg)
        self.sql = SqlCounter(self.db.engine)
        self.times: list[float] = []
        self.calls: list[int] = []
        self.stmts: tuple[int, int, int] = (0, 0, 0)

    def one_pass(self, record: bool) -> None:
        os.environ["ORCH_HOME"] = str(self.cfg.home)
        be = InstantBackend()
        self.sql.reset()
        t0 = time.perf_counter()
        rep = reconcile_pass(self.db, self.cfg, backend_for=lambda _name: be)
        total = time.perf_counter() - t0
        assert rep.ran and not rep.changed and not rep.errors, rep.as_dict()
        if record:
            self.times.append(total - be.seconds)
            self.calls.append(be.calls)
            self.stmts = (self.sql.reads, self.sql.writes, self.sql.begins_immediate)
            self.polled = rep.polled

    def close(self) -> dict:
        self.db.engine.dispose()
        unchanged = _changed_rows(self.src) == _changed_rows(self.path)
        return {"times": self.times, "calls": max(self.calls), "polled": self.polled, "reads": self.stmts[0],
                "writes": self.stmts[1], "begins": self.stmts[2], "rows_unchanged": unchanged,
                "db_mib": self.src.stat().st_size / 2**20}


def measure_fake(live: int, histories: tuple[int, int], runs: int, work: Path) -> tuple[dict, dict]:
    """Passes over the two DBs, ALTERNATING, so that load from other processes hits both alike."""
    small, big = FakeSetup(live, histories[0], work), FakeSetup(live, histories[1], work)
    for i in range(runs + 1):  # the first round warms the page cache and SQLAlchemy's statement cache
        for setup in (small, big) if i % 2 else (big, small):
            setup.one_pass(record=i > 0)
    return small.close(), big.close()


# ------------------------------------------------------------------------------------------------
# real local backend
# ------------------------------------------------------------------------------------------------
def _sleepers(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             start_new_session=True) for _ in range(n)]


def _ext_id(pid: int) -> str:
    """The id the local backend records for a session leader ``pid`` (sid@ticks@pidns.timens)."""
    p = proctable.read_proc(pid)
    return format_id(pid, p.start_ticks if p else None, proctable.namespaces())


def measure_local(live: int, runs: int, work: Path) -> dict:
    """1,000 live attempts on the real local backend: a steady pass, then a pass where all finished."""
    home = work / "home-local"
    cfg = _cfg(home)
    db = Database(cfg)
    db.engine.dispose()
    procs = _sleepers(live)
    try:
        ids = [_ext_id(p.pid) for p in procs]
        con = sqlite3.connect(home / "orch.db", isolation_level=None)
        con.execute("BEGIN")
        con.executemany(
            "INSERT INTO jobs (id, name, state, backend, run_dir, command_json, resources_json, outputs_json, "
            "max_attempts, overrides_json, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [(k + 1, f"live-{k:05d}", "running", "local", str(cfg.runs_root / f"live-{k:05d}"), '["true"]', "{}",
              "[]", 3, "{}", TS, TS) for k in range(live)])
        con.executemany(
            "INSERT INTO attempts (id, job_id, n, token, state, backend, external_id, overrides_json, counted, "
            "restarts, submitted_at, started_at, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [(k + 1, k + 1, 1, f"l{k:015x}", "running", "local", ids[k], "{}", 1, 0, TS, TS, TS)
             for k in range(live)])
        con.execute("COMMIT")
        con.close()
        for k in range(live):  # what a real attempt has on disk while it runs
            rd = cfg.runs_root / f"live-{k:05d}"
            ad = protocol.attempt_dir(rd, 1)
            ad.mkdir(parents=True)
            protocol.atomic_write_json(ad / "wrapper.json", {"token": f"l{k:015x}", "pid": procs[k].pid})
            protocol.write_progress(rd, 1, step=10)
        db = Database(cfg)
        sql = SqlCounter(db.engine)
        steady, calls, writes = [], [], []
        for i in range(runs + 1):
            be = TimedLocal()
            sql.reset()
            t0 = time.perf_counter()
            rep = reconcile_pass(db, cfg, backend_for=lambda _n, be=be: be)
            total = time.perf_counter() - t0
            assert rep.ran and not rep.changed and not rep.errors and rep.polled == live, rep.as_dict()
            if i:
                steady.append((total, total - be.seconds, be.seconds))
                calls.append(be.calls)
                writes.append(sql.writes)
        # Every attempt ends with a verified marker and the wrapper's exit record: one pass finishes all.
        for p in procs:  # ...and its processes are gone (a live session is never finished)
            p.kill()
            p.wait()
        for k in range(live):
            rd = cfg.runs_root / f"live-{k:05d}"
            (rd / "result").mkdir()
            (rd / "result" / "out.txt").write_text(f"result {k}\n")
            protocol.write_done_marker(rd, f"live-{k:05d}", 1, ["result/out.txt"])
            protocol.atomic_write_json(protocol.attempt_dir(rd, 1) / protocol.EXIT_FILE,
                                       {"returncode": 0, "signal": None, "token": f"l{k:015x}"})
        be = TimedLocal()
        sql.reset()
        t0 = time.perf_counter()
        rep = reconcile_pass(db, cfg, backend_for=lambda _n: be)
        fin_total = time.perf_counter() - t0
        done = sum(1 for c in rep.changed if c.to == "done_marker_verified")
        assert done == live, rep.as_dict()
        db.engine.dispose()
        return {"steady": steady, "calls": max(calls), "steady_writes": max(writes),
                "finish": (fin_total, fin_total - be.seconds, be.seconds), "finish_writes": sql.writes,
                "finished": done}
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def measure_rss(live: int, work: Path, runs: int = 5) -> dict:
    """Peak RSS of a real `orch reconcile` subprocess with ``live`` live local jobs (all "running")."""
    sleeper = _sleepers(1)[0]
    try:
        home = work / "home-rss"
        cfg = _cfg(home)
        cfg.runs_root.mkdir(parents=True, exist_ok=True)
        db_path = home / "orch.db"
        generate(db_path, live, live, cfg.runs_root, external_id=_ext_id(sleeper.pid))
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
        env["ORCH_HOME"] = str(home)
        orch = [C.ORCH] if Path(C.ORCH).exists() else [C.PY, "-m", "orchestrator.cli"]
        rss, walls, base_rss, base_walls = [], [], [], []
        for i in range(runs + 1):
            rc, wall, maxrss, out, err = C.child_run([*orch, "reconcile", "--json"], env=env)
            assert rc == 0, err
            import json

            rep = json.loads(out)
            assert rep["polled"] == live and not rep["changed"], {k: rep[k] for k in ("polled", "unknown", "errors")}
            rc, bwall, brss, _o, _e = C.child_run([C.PY, "-c", "import sqlalchemy.orm, click"], env=env)
            if i:
                rss.append(maxrss)
                walls.append(wall)
                base_rss.append(brss)
                base_walls.append(bwall)
        return {"rss_kib": rss, "wall": walls, "base_rss_kib": base_rss, "base_wall": base_walls}
    finally:
        sleeper.kill()
        sleeper.wait()


# ------------------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=11, help="timed passes per configuration (median reported)")
    ap.add_argument("--live", type=int, default=10_000)
    ap.add_argument("--history", type=int, default=1_000_000)
    ap.add_argument("--local-live", type=int, default=1_000)
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    C.add_quick(ap)
    args = ap.parse_args()
    if args.quick:
        args.runs, args.live, args.history, args.local_live, args.no_write = 1, 100, 1000, 5, True
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    work = Path(tempfile.mkdtemp(prefix="orch-bench-reconcile-"))
    try:
        print(f"P1 reconcile: {args.live} live jobs; history {args.live} vs {args.history}", flush=True)
        small, big = measure_fake(args.live, (args.live, args.history), args.runs, work)
        ratio = C.stats(big["times"])[0] / C.stats(small["times"])[0]
        print(f"  pass w/o backend, {args.live} history: {C.fmt(small['times'])}", flush=True)
        print(f"  pass w/o backend, {args.history} history: {C.fmt(big['times'])}; ratio {ratio:.2f}", flush=True)
        loc = measure_local(args.local_live, args.runs, work)
        print(f"  local {args.local_live}: steady {C.fmt([t[0] for t in loc['steady']])}", flush=True)
        rss = measure_rss(args.live, work)
        print(f"  orch reconcile RSS {C.stats(rss['rss_kib'])[0] / 1024:.0f} MiB", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    mib = lambda xs: f"{C.stats(xs)[0] / 1024:.0f} ({min(xs) / 1024:.0f}–{max(xs) / 1024:.0f}) MiB"  # noqa: E731
    n = args.runs
    rows = [
        [f"pass, {args.live:,} live + {args.live:,} finished, fake backend (excl. backend)",
         C.fmt(small["times"]), f"{small['calls']}", f"{small['reads']} reads, {small['writes']} writes, "
         f"{small['begins']} write txns", "—"],
        [f"pass, {args.live:,} live + {args.history:,} finished, fake backend (excl. backend)",
         C.fmt(big["times"]), f"{big['calls']}", f"{big['reads']} reads, {big['writes']} writes, "
         f"{big['begins']} write txns", "backend calls = 1 " + ("✅" if big["calls"] == 1 else "❌")],
        ["**ratio 1M-history / 10k-history**", f"**{ratio:.2f}**", "", "",
         "<= 1.2 " + ("✅" if ratio <= 1.2 else "❌")],
        [f"pass, {args.local_live:,} live, real local backend, nothing changed (total)",
         C.fmt([t[0] for t in loc["steady"]]), f"{loc['calls']}", f"{loc['steady_writes']} writes",
         "no job/attempt write " + ("✅" if loc["steady_writes"] <= 3 else "❌")],
        ["  of which inside LocalBackend.poll (/proc scan, exit.json)", C.fmt([t[2] for t in loc["steady"]]),
         "", "", ""],
        ["  of which orch (excl. backend)", C.fmt([t[1] for t in loc["steady"]]), "", "", ""],
        [f"pass, {args.local_live:,} live, all ended with a verified done.json (1 run)",
         f"{loc['finish'][0] * 1e3:.0f} ms ({loc['finish'][2] * 1e3:.0f} ms in poll)", "1",
         f"{loc['finish_writes']} writes", f"{loc['finished']} -> done_marker_verified"],
        [f"peak RSS, `orch reconcile` subprocess, {args.live:,} live local jobs", mib(rss["rss_kib"]), "", "",
         f"wall {C.fmt(rss['wall'])}"],
        ["peak RSS, `python -c \"import sqlalchemy.orm, click\"` (baseline)", mib(rss["base_rss_kib"]), "", "",
         f"wall {C.fmt(rss['base_wall'])}"],
    ]
    tbl = C.table(["measurement", f"median (min–max) of {n}", "backend calls", "SQL per pass", "goal"], rows)
    print(tbl)
    notes = (f"Generated DB: {big['db_mib']:.0f} MiB ({args.history:,} finished jobs with one attempt and two "
             f"events each, {args.live:,} live), cached in `{CACHE}`. The fake backend answers \"running\" for "
             "every attempt, so a pass changes nothing; the job/attempt/event rows are compared before and after "
             f"(unchanged: {big['rows_unchanged'] and small['rows_unchanged']}). Passes over the two DBs "
             "alternate, so load from other processes on this shared machine hits both sides of the ratio alike. "
             "\"Write txns\" counts BEGIN "
             "IMMEDIATE: the lease take and release (which also stores the pass's duration and failed "
             "scheduler queries for `orch metrics`, one UPDATE in the same transaction) are the only writes of a "
             "pass that changed nothing. "
             "The RSS run points every live attempt at one real sleeping process (each poll really reads /proc).\n\n"
             "Fixed on 2026-11-29 after this bench's first run: a steady pass opened one write transaction per "
             "live attempt even when the poll changed nothing. At 10,000 live it took 5.2 s (20,006 reads, "
             "10,002 BEGIN IMMEDIATE, each holding the writer lock); `reconcile._unchanged` now skips those, "
             "decided on the pass's own read. Profile of the fixed pass (cProfile, 10,000 live): ~60 % reading "
             "each running attempt's heartbeat for hang detection (one open() per attempt, most of it pathlib), "
             "~20 % building the AttemptRefs, ~7 % fetching the rows; no query touches finished jobs (they are "
             "reached only through the index on attempts.state).\n\n"
             "Fixed on 2026-12-02 (the ratio had risen to 1.37): the generator runs `ANALYZE`, and with its "
             "per-state averages (252,500 rows per state) SQLite chose to scan all 1M attempts for the poll's IN "
             "of three live states (109 ms against 7 ms through the index). Migration 0009 adds `ix_attempts_open`, "
             "a partial index holding only the attempts not yet ended, and the poll names its WHERE term "
             "literally, so the plan no longer depends on statistics (tests/unit/test_open_attempts_index.py pins "
             "it under such statistics).")
    if not args.no_write:
        C.replace_section("Reconcile (P1)", C.preamble("bench_reconcile.py", notes) + "\n" + tbl)
    if args.quick:  # a smoke test: the ratio is a timing of a quiet machine, one backend call is what the code does
        return 0 if big["calls"] == 1 else 1
    return 0 if ratio <= 1.2 and big["calls"] == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
