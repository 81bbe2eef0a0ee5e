"""P6, part 2: one reconcile pass with 10,000 live array tasks vs 10,000 live single Slurm jobs.

orch's side is real: a DB at the schema head (Alembic), rows bulk-inserted as ``launch`` records
them (an array task: external id ``<array id>_<task>``, the array's ``batch_token``, its job in a
sweep with a ``task_index``; a single job: a plain id, no batch token), the REAL ``SlurmBackend`` and
``reconcile_pass``. The scheduler is scripted: ``sacct`` and ``squeue`` are PATH shims that log
their argv and print pre-generated output in exactly the format the backend asks for
(``states.SACCT_FIELDS`` with ``-X --duplicates -n --parsable2``; ``states.SQUEUE_FORMAT``). Running
array tasks appear in sacct as one ``A_T`` line each; pending ones as one collapsed ``A_[0-999]``
line per array, as measured on the dev cluster (Slurm 22.05).
"""

from __future__ import annotations

import gc
import json
import os
import sqlite3
import time
from pathlib import Path

import bench_reconcile as R

from orchestrator.backends.slurm import backend as slurm_backend_mod
from orchestrator.backends.slurm.backend import SlurmBackend
from orchestrator.core.db import Database
from orchestrator.ops.reconcile import reconcile_pass

ARRAY_BASE, SINGLE_BASE = 700_000, 100_000  # Slurm ids of the scripted jobs (arrays / singles)


def _shims(work: Path) -> Path:
    """A directory with ``sacct`` and ``squeue`` that log their argv and print the prepared output."""
    d = work / "shim-sched"
    d.mkdir(parents=True, exist_ok=True)
    for tool in ("sacct", "squeue"):
        var = f"P6_{tool.upper()}_OUT"
        (d / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "$P6_SCHED_LOG"\nexec cat "${var}"\n')
        (d / tool).chmod(0o755)
    return d


def generate(path: Path, mode: str, live: int, per_array: int, state: str) -> tuple[str, str, set[str]]:
    """Create ``path`` (Alembic, then raw ``executemany``); return (sacct text, squeue text, -j ids).

    ``mode``: "array" (``live // per_array`` sweeps of ``per_array`` tasks, each one array) or
    "single". ``state``: "running" (attempts running, sacct RUNNING) or "submitted" (sacct PENDING).
    """
    home = path.parent
    cfg = R._cfg(home)
    cfg.db_url = f"sqlite:///{path}"
    Database(cfg).engine.dispose()
    ts, started = R.TS, (R.TS if state == "running" else None)
    sched = "RUNNING" if state == "running" else "PENDING"
    n_arrays = live // per_array if mode == "array" else 0
    sweeps, jobs, attempts, sacct, squeue, asked = [], [], [], [], [], set()
    for s in range(n_arrays):
        params = json.dumps([{"seed": t} for t in range(per_array)])
        sweeps.append((s + 1, f"sw{s:03d}", "slurm", None, params, ts))
        aid, batch = ARRAY_BASE + s * (per_array + 1), f"b{s:016x}"
        asked.add(str(aid))
        if state != "running":  # a pending array is ONE collapsed record, in sacct and in squeue without -r
            sacct.append(f"{aid}|orch-{batch}|PENDING|0:0|{s + 1}|BeginTime|{aid}_[0-{per_array - 1}]")
    for k in range(live):
        s, t = divmod(k, per_array) if mode == "array" else (None, None)
        name = f"sw{s:03d}.{t:04d}" if s is not None else f"job-{k:05d}"
        jobs.append((k + 1, name, state, "slurm", f"{home}/runs/{name}", '["python", "train.py"]', "{}", "[]", 3, "{}",
                     ts, ts, None if s is None else s + 1, t))
        token = f"t{k:015x}"
        if s is not None:
            aid, batch = ARRAY_BASE + s * (per_array + 1), f"b{s:016x}"
            ext, jname, raw = f"{aid}_{t}", f"orch-{batch}", aid + 1 + t  # JobIDRaw: a per-task number
        else:
            ext, batch, jname = str(SINGLE_BASE + k), None, f"orch-{token}"
            raw = SINGLE_BASE + k
            asked.add(ext)
        attempts.append((k + 1, k + 1, 1, token, state, "slurm", ext, sched, "{}", 1, 0, ts, started, ts, batch))
        if s is None or state == "running":
            sacct.append(f"{raw}|{jname}|{sched}|0:0|{k + 1}|None|{ext}")
        squeue.append(f"{ext}|{jname}|{sched}|None")
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("BEGIN")
    con.executemany("INSERT INTO sweeps (id, name, backend, throttle, params_json, created_at) VALUES (?,?,?,?,?,?)",
                    sweeps)
    con.executemany("INSERT INTO jobs (id, name, state, backend, run_dir, command_json, resources_json, outputs_json, "
                    "max_attempts, overrides_json, created_at, updated_at, sweep_id, task_index) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", jobs)
    con.executemany("INSERT INTO attempts (id, job_id, n, token, state, backend, external_id, backend_state, "
                    "overrides_json, counted, restarts, submitted_at, started_at, created_at, batch_token) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", attempts)
    con.execute("COMMIT")
    con.execute("ANALYZE")
    con.close()
    return "\n".join(sacct) + "\n", "\n".join(squeue) + "\n", asked


class TimedSlurm(SlurmBackend):
    """The real Slurm backend; records the time inside ``poll``."""

    def __init__(self) -> None:
        super().__init__()
        self.poll_s = 0.0

    def poll(self, refs):
        t0 = time.perf_counter()
        try:
            return super().poll(refs)
        finally:
            self.poll_s += time.perf_counter() - t0


class _TimedRun:
    """Wraps the backend module's ``_run`` (the sacct/squeue subprocess) to time the scheduler call."""

    def __init__(self) -> None:
        self.real = slurm_backend_mod._run
        self.seconds = 0.0

    def __call__(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return self.real(*a, **kw)
        finally:
            self.seconds += time.perf_counter() - t0


class Setup:
    """One generated DB in its own ORCH_HOME, with its scripted scheduler output."""

    def __init__(self, mode: str, live: int, per_array: int, state: str, work: Path) -> None:
        self.mode, self.live = mode, live
        home = work / f"home-{mode}-{state}"
        home.mkdir(parents=True)
        self.sacct_out, self.squeue_out = home / "sacct.out", home / "squeue.out"
        sacct, squeue, self.asked = generate(home / "orch.db", mode, live, per_array, state)
        self.sacct_out.write_text(sacct)
        self.squeue_out.write_text(squeue)
        self.log = home / "sched.log"
        self.cfg = R._cfg(home)
        self.db = Database(self.cfg)
        self.sql = R.SqlCounter(self.db.engine)
        self.rows: list[dict] = []

    def one_pass(self, record: bool) -> None:
        os.environ.update(ORCH_HOME=str(self.cfg.home), P6_SACCT_OUT=str(self.sacct_out),
                          P6_SQUEUE_OUT=str(self.squeue_out), P6_SCHED_LOG=str(self.log))
        self.log.write_text("")
        be, run = TimedSlurm(), _TimedRun()
        slurm_backend_mod._run = run
        self.sql.reset()
        gc.collect()  # each pass starts with the same garbage: a collection lands on neither side by chance
        try:
            c0, t0 = time.process_time(), time.perf_counter()
            rep = reconcile_pass(self.db, self.cfg, backend_for=lambda _n: be)
            total, cpu = time.perf_counter() - t0, time.process_time() - c0
        finally:
            slurm_backend_mod._run = run.real
        calls = self.log.read_text().splitlines()
        assert rep.ran and not rep.changed and not rep.errors, rep.as_dict()
        assert rep.polled == self.live and rep.unknown == 0, (rep.polled, rep.unknown)  # every attempt answered
        sacct = [c for c in calls if c.startswith("sacct ")]
        asked = set(sacct[0].split(" -j ", 1)[1].split(",")) if sacct else set()
        assert asked == self.asked, "sacct was asked about other ids than the attempts' jobs"
        if record:
            self.rows.append({"total": total, "cpu": cpu, "sched": run.seconds, "poll": be.poll_s, "sacct": len(sacct),
                              "squeue": sum(c.startswith("squeue ") for c in calls),
                              "argv_kib": len(sacct[0]) / 1024 if sacct else 0.0,
                              "reads": self.sql.reads, "writes": self.sql.writes})

    def close(self) -> dict:
        self.db.engine.dispose()
        rows = self.rows
        return {"total": [r["total"] for r in rows], "cpu": [r["cpu"] for r in rows],
                "excl": [r["total"] - r["sched"] for r in rows],
                "parse": [r["poll"] - r["sched"] for r in rows], "sched": [r["sched"] for r in rows],
                "sacct": max(r["sacct"] for r in rows), "squeue": max(r["squeue"] for r in rows),
                "argv_kib": rows[0]["argv_kib"], "ids": len(self.asked), "reads": rows[-1]["reads"],
                "writes": rows[-1]["writes"], "sacct_lines": len(self.sacct_out.read_text().splitlines())}


def measure(live: int, per_array: int, runs: int, work: Path, state: str = "running") -> dict[str, dict]:
    """Passes over the array DB and the single-job DB, ALTERNATING (the first round warms up)."""
    shim = _shims(work)
    old_path = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{shim}:{old_path}"
    try:
        setups = {m: Setup(m, live, per_array, state, work) for m in ("array", "single")}
        order = list(setups.values())
        for i in range(runs + 1):
            for s in order if i % 2 else order[::-1]:
                s.one_pass(record=i > 0)
        return {m: s.close() for m, s in setups.items()}
    finally:
        os.environ["PATH"] = old_path
