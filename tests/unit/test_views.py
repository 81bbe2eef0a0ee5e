"""orchestrator.views.show: the read-only views behind status/show/logs. `orch status` has two paths to one set of
rows (SQLAlchemy on any DB; stdlib sqlite3 on SQLite): they must agree row for row. `orch show` is the DB
plus what the run dir holds; `orch logs` names the attempt's files or refuses a number that does not exist."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator import protocol
from orchestrator.errors import UsageError
from orchestrator.ops.reconcile import reconcile_pass
from orchestrator.ops.submit import SubmitRequest, submit
from orchestrator.ops.sweep import SweepRequest, submit_sweep
from orchestrator.views.show import log_paths, show_job, show_sweep, status_rows
from orchestrator.views.status import quick_status_rows


def _jobs_in_every_state(db, cfg, sched) -> None:
    for n in ("run", "fail", "ok"):
        submit(db, cfg, SubmitRequest(name=n, command=["true"], outputs=["o.txt"] if n == "ok" else []))
    submit_sweep(db, cfg, SweepRequest(name="sw", command=["echo", "{x}"], params=[{"x": 1}, {"x": 2}]))
    ok = cfg.runs_root / "ok"
    (ok / "o.txt").write_text("x\n")
    protocol.write_done_marker(ok, "ok", 1, ["o.txt"])
    protocol.write_progress(cfg.runs_root / "run", 1, step=7)
    sched.ended.update(fail=1, ok=0)
    reconcile_pass(db, cfg, backend_for=lambda _n: sched)


def test_the_fast_and_the_slow_status_paths_give_the_same_rows(db, cfg, sched):
    _jobs_in_every_state(db, cfg, sched)
    slow, total = status_rows(db, cfg)
    fast = quick_status_rows(cfg)
    assert fast is not None, "the quick path declined a private SQLite DB at the current revision"
    assert fast == (slow, total) and total == len(slow)
    states = {r["name"]: r["state"] for r in slow}
    assert (states["run"], states["fail"], states["ok"]) == ("running", "retryable_failed", "done_marker_verified")
    assert {r["sweep"] for r in slow} == {None, "sw"} and next(r for r in slow if r["name"] == "run")["step"] == 7
    for state in ("running", "retryable_failed"):
        rows = [r for r in slow if r["state"] == state]
        assert quick_status_rows(cfg, state) == status_rows(db, cfg, state) == (rows, len(rows))


def test_the_window_shows_live_jobs_recent_ends_and_whole_sweeps_and_counts_the_rest(db, cfg, sched):
    """`orch status`'s default window on both paths: a live job whatever its age, an ended job only if it ended
    since the cutoff, a sweep whole when one task is shown; the total says how many were left out."""
    from sqlalchemy import update

    from orchestrator.core.models import Job
    from orchestrator.core.states import JobState

    _jobs_in_every_state(db, cfg, sched)  # "ok" ended now
    submit(db, cfg, SubmitRequest(name="old", command=["true"]))
    submit_sweep(db, cfg, SweepRequest(name="oldsw", command=["echo", "{x}"], params=[{"x": 1}]))
    long_ago, now = datetime(2026, 1, 1), datetime.now(UTC).replace(tzinfo=None)
    with db.write() as s:
        s.execute(update(Job).where(Job.name.in_(["run", "fail"])).values(updated_at=long_ago))  # live: shown
        s.execute(update(Job).where(Job.name.in_(["old", "sw.0000", "oldsw.0000"]))
                  .values(state=JobState.CANCELLED, updated_at=long_ago))
    cutoff = now - timedelta(days=1)
    slow, total = status_rows(db, cfg, cutoff=cutoff)
    assert quick_status_rows(cfg, cutoff=cutoff) == (slow, total)
    assert [r["name"] for r in slow] == ["run", "fail", "ok", "sw.0000", "sw.0001"] and total == 7
    assert status_rows(db, cfg, "cancelled", cutoff) == ([r for r in slow if r["name"] == "sw.0000"], 3)
    assert quick_status_rows(cfg, "cancelled", cutoff) == status_rows(db, cfg, "cancelled", cutoff)
    assert len(status_rows(db, cfg, cutoff=long_ago)[0]) == 7  # all of them moved since


def test_show_job_joins_the_db_and_the_run_dir(db, cfg, sched):
    _jobs_in_every_state(db, cfg, sched)
    d = show_job(db, "fail")
    assert (d["name"], d["state"], d["run_dir"]) == ("fail", "retryable_failed", str(cfg.runs_root / "fail"))
    (a,) = d["attempts"]
    assert a["failure_class"] == "crash" and a["restart_history"] == [] and a["action"]["action"] == "resume"
    assert d["preemptions"] == {"total": 0, "in_place": 0} and d["problems"] == []
    assert show_job(db, "ok")["state"] == "done_marker_verified"


def test_show_sweep_lists_its_tasks_and_is_none_for_a_plain_job(db, cfg, sched):
    _jobs_in_every_state(db, cfg, sched)
    sw = show_sweep(db, "sw")
    assert [t["task"] for t in sw["task_list"]] == [0, 1] and sw["params"] == [{"x": 1}, {"x": 2}]
    assert show_sweep(db, "run") is None


def test_log_paths_names_the_attempts_files_and_refuses_an_attempt_that_does_not_exist(db, cfg, sched):
    _jobs_in_every_state(db, cfg, sched)
    paths, live = log_paths(db, "run", None)
    d = protocol.attempt_dir(cfg.runs_root / "run", 1)
    assert paths == [d / protocol.STDOUT_LOG, d / protocol.STDERR_LOG]
    assert live() is True  # the scheduler says running
    assert log_paths(db, "fail", 1)[1]() is False  # ended: no backend call needed
    with pytest.raises(UsageError, match=r"job 'run' has no attempt 3 \(attempts: \[1\]\)"):
        log_paths(db, "run", 3)
