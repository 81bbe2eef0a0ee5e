"""orchestrator.views.status: `orch status`'s rows -- the query kept in the source (the quick path) equal to what
the models compile, the slow/hung flags of a running job, the sweep grouping."""

from __future__ import annotations

import json
import os
import time

from orchestrator import protocol
from orchestrator.core.models import Attempt, Job
from orchestrator.kit.heartbeat import Heartbeat
from orchestrator.views.show import status_rows


def _running_job(db, cfg, name: str) -> None:
    with db.write() as s:
        job = Job(name=name, state="running", backend="local", run_dir=str(cfg.runs_root / name),
                  command=["true"])
        s.add(job)
        s.flush()
        s.add(Attempt(job_id=job.id, n=1, token=name, state="running", backend="local", external_id="1:1"))


def _progress(cfg, name: str, **fields) -> None:
    protocol.write_progress(cfg.runs_root / name, 1, step=100, **fields)


def test_slow_job_is_flagged_against_its_own_median(db, cfg):
    _running_job(db, cfg, "slow")
    _running_job(db, cfg, "steady")
    _progress(cfg, "slow", tokens_per_s_recent=100.0, tokens_per_s_median=1000.0, samples=20)
    _progress(cfg, "steady", tokens_per_s_recent=900.0, tokens_per_s_median=1000.0, samples=20)
    rows = {r["name"]: r for r in status_rows(db, cfg)[0]}
    assert rows["slow"]["flags"] == ["slow"] and rows["slow"]["step"] == 100
    assert rows["steady"]["flags"] == []


def test_few_samples_are_not_judged_slow(db, cfg):
    _running_job(db, cfg, "young")
    _progress(cfg, "young", tokens_per_s_recent=1.0, tokens_per_s_median=1000.0, samples=2)
    assert status_rows(db, cfg)[0][0]["flags"] == []


def _aged(path, age: float) -> None:
    t = time.time() - age
    os.utime(path, (t, t))


def test_stale_heartbeat_is_flagged_hang(db, cfg):
    """Stale by the hang stop's own rule (staleness.judge): when the file was last written, not the "time" the job
    wrote in it (a node clock 60 s behind had `orch status` flag a healthy job hung, as the stop once did)."""
    _running_job(db, cfg, "stuck")
    _running_job(db, cfg, "skewed")
    for name, t in (("stuck", time.time()), ("skewed", time.time() - cfg.hang_timeout_s - 5)):
        d = protocol.attempt_dir(cfg.runs_root / name, 1)
        d.mkdir(parents=True)
        (d / protocol.PROGRESS_FILE).write_text(json.dumps({"time": t, "step": 7}))
    _aged(protocol.attempt_dir(cfg.runs_root / "stuck", 1) / protocol.PROGRESS_FILE, cfg.hang_timeout_s + 5)
    rows = {r["name"]: r for r in status_rows(db, cfg)[0]}
    assert (rows["stuck"]["flags"], rows["skewed"]["flags"]) == (["hang"], [])


def test_any_ranks_stale_heartbeat_flags_hang_as_the_hang_stop_judges_it(db, cfg):
    """The flag read rank 0's progress.json only: rank 1 hung (its file 700 s old) or never beat while rank 0 still
    beat showed a healthy row, until the reconciler stopped the attempt. The same rule as the stop now."""
    for name in ("hung1", "never", "healthy"):
        _running_job(db, cfg, name)
        protocol.write_progress(cfg.runs_root / name, 1, step=41, world_size=2)
    for name in ("hung1", "healthy"):
        protocol.write_rank_progress(cfg.runs_root / name, 1, 1, 40)
    _aged(protocol.attempt_dir(cfg.runs_root / "hung1", 1) / protocol.RANK_PROGRESS.format(1), cfg.hang_timeout_s + 100)
    # "never": rank 0's first heartbeat (and the wrapper's start) long ago, rank 1 never wrote one
    d = protocol.attempt_dir(cfg.runs_root / "never", 1)
    (d / protocol.PROGRESS_HISTORY).write_text(json.dumps({"time": time.time() - cfg.hang_timeout_s - 100}) + "\n")
    (d / protocol.WRAPPER_FILE).write_text("{}")
    _aged(d / protocol.WRAPPER_FILE, cfg.hang_timeout_s + 100)
    rows = {r["name"]: r for r in status_rows(db, cfg)[0]}
    assert {n: r["flags"] for n, r in rows.items()} == {"hung1": ["hang"], "never": ["hang"], "healthy": []}


def test_heartbeat_writes_recent_rate_and_its_own_median(tmp_path):
    hb = Heartbeat(tmp_path, 1, interval_s=3600)  # no thread: writes are driven by hand below
    for step in range(1, 8):
        hb.post(step=step * 10, tokens_per_step=50)
        hb._write()
        time.sleep(0.01)
    p = protocol.read_progress(tmp_path, 1)
    assert p["samples"] == 6 and p["step"] == 70
    assert p["tokens_per_s_recent"] > 0 and p["tokens_per_s_median"] > 0


def test_the_quick_status_runs_the_generated_text_of_the_models_query_by_its_columns():
    """The quick path runs the text ``ops/statements.py`` generates from ``status_select`` (its freshness:
    tests/unit/test_sqlitetext.py), never SQL from a file, and reads its rows by the query's own columns."""
    from orchestrator.core.sqlitetext import SQL
    from orchestrator.ops import statements
    from orchestrator.views import status as statusview

    for state in (None, statements.given("state")):
        for windowed in (False, True):
            name = statusview.status_statement(None if state is None else "x", True if windowed else None)
            q = statusview.status_select(state, windowed=windowed)
            assert SQL[name] == statements.compiled(q)[0]
            assert statusview.STATUS_KEYS == tuple(q.selected_columns.keys())
    assert ":state" in SQL["status_in_state"] and ":" not in SQL["status"] and ":cutoff" in SQL["status_since"]


def test_a_sweeps_tasks_are_one_row_counting_their_states_and_att_is_the_furthest_task():
    from orchestrator.views.status import group_by_sweep

    def row(name: str, state: str, attempts: int, sweep: str | None = None, flags: tuple = ()) -> dict:
        return {"name": name, "state": state, "attempts": attempts, "backend": "local", "sweep": sweep,
                "flags": list(flags)}

    rows = [row("solo", "running", 1), row("sw.0", "running", 1, "sw", ("slow",)),
            row("sw.1", "retryable_failed", 3, "sw"), row("sw.2", "running", 2, "sw", ("hang",))]
    solo, sw = group_by_sweep(rows)
    assert solo is rows[0]
    assert (sw["name"], sw["tasks"], sw["attempts"], sw["attempts_total"]) == ("sw", 3, 3, 6)
    assert sw["state"] == "sweep of 3: 1 retryable_failed, 2 running" and sw["flags"] == ["hang", "slow"]


def test_a_start_up_hang_is_flagged_before_any_heartbeat(db, cfg):
    """Hostile pass: rank 1 stopped in its start; the reconciler judged it hung, `orch status` showed no
    flag (it judged only jobs with a progress.json). Rank 0 armed long ago, rank 1 never did: flagged."""
    _running_job(db, cfg, "start")
    _running_job(db, cfg, "fresh")
    for name, age in (("start", cfg.hang_timeout_s + 50), ("fresh", 1.0)):
        d = protocol.attempt_dir(cfg.runs_root / name, 1)
        d.mkdir(parents=True)
        (d / protocol.WRAPPER_FILE).write_text("{}")
        _aged(d / protocol.WRAPPER_FILE, cfg.hang_timeout_s + 100)
        protocol.write_rank_armed(cfg.runs_root / name, 1, 0, 2, time.time() - age)
        _aged(d / protocol.RANK_ARMED.format(0), 1.0)  # rank 0 alive, refreshing
    rows = {r["name"]: r for r in status_rows(db, cfg)[0]}
    assert {n: r["flags"] for n, r in rows.items()} == {"start": ["hang"], "fresh": []}
