"""Preemption tallies settled into the attempts' rows (migration 0014): `orch metrics` sums the settled ones and reads
the run dirs only of attempts not settled yet. Measuring every preemption from its heartbeat files took 7.3 s at
100,000 jobs (bench/bench_dashboard.py), on every reconcile pass that exports the textfile."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from orchestrator import protocol
from orchestrator.core.jobqueries import get_job
from orchestrator.core.lifecycle import AttemptState, utcnow
from orchestrator.core.models import Attempt, FleetTally
from orchestrator.ops import tallies
from orchestrator.ops.submit import SubmitRequest, submit
from orchestrator.protocol import FailureClass
from orchestrator.views.metrics import collect

pytestmark = pytest.mark.each_db  # the compare-and-set and the totals' upsert on PostgreSQL too


def _history(db, cfg) -> None:
    """Attempt 1 preempted at step 45 (last heartbeat 50); attempt 2 resumed from 40, reached 60, was rerun in place
    once (no record set aside: a preemption, unmeasured) and preempted; attempt 3 resumed from 55 and runs."""
    submit(db, cfg, SubmitRequest(name="j", command=["true"]))
    rd = cfg.runs_root / "j"
    protocol.write_progress(rd, 1, step=50)
    protocol.write_progress(rd, 2, step=60, resumed_from=40)
    protocol.write_progress(rd, 3, step=70, resumed_from=55)
    with db.write() as s:
        job = get_job(s, "j")
        a1 = job.attempts[0]
        a1.state, a1.failure_class, a1.failure_step, a1.ended_at = (AttemptState.FAILED, FailureClass.PREEMPTED, 45,
                                                                    utcnow())
        s.add(Attempt(job_id=job.id, n=2, token="b" * 32, state=AttemptState.FAILED, backend="local", restarts=1,
                      failure_class=FailureClass.PREEMPTED, failure_step=60, ended_at=utcnow()))
        s.add(Attempt(job_id=job.id, n=3, token="c" * 32, state=AttemptState.RUNNING, backend="local"))


def _measures(db) -> tuple[int, int, int, int]:
    snap = collect(db)
    return snap.redone_sum, snap.redone_count, snap.unmeasured, snap.failures["preempted"]


def _stored(db) -> list[tuple]:
    with db.read() as s:
        return [(a.n, a.redone_sum, a.redone_count, a.redone_unmeasured, a.restart_classes)
                for a in get_job(s, "j").attempts]


def test_an_ended_attempts_tally_is_settled_once_and_the_metrics_then_sum_it_without_its_files(db, cfg):
    _history(db, cfg)
    # 50 - 40 after attempt 1, 60 - 55 after attempt 2 (attempt 3 runs: read from files); the in-place rerun is a
    # preemption by its class (the SQL count holds attempts 1 and 2) and unmeasured.
    expected = (15, 2, 1, 3)
    assert _measures(db) == expected and _stored(db)[0][1:] == (None,) * 4  # nothing settled yet: from the files
    assert tallies.settle_tallies(db) == 2  # the two ended ones; the running one stays open
    with db.read() as s:
        assert dict(s.execute(select(FleetTally.name, FleetTally.value)).all()) == {
            "failures/preempted": 3, "redone_sum": 10, "redone_count": 1, "unmeasured": 1}
    assert _stored(db) == [(1, 0, 0, 0, None), (2, 10, 1, 1, ["preempted"]), (3, None, None, None, None)]
    # attempt 2 is settled: its tally no longer needs attempt 1's heartbeats
    for f in (protocol.PROGRESS_FILE, protocol.PROGRESS_HISTORY):
        (protocol.attempt_dir(cfg.runs_root / "j", 1) / f).unlink()
    assert _measures(db) == expected
    assert tallies.settle_tallies(db) == 0  # settled once: a steady pass writes nothing


def test_a_tally_settled_meanwhile_by_another_pass_is_counted_once(db, cfg, monkeypatch):
    """The mark is a compare-and-set on the row being unsettled, and only what this transaction marked is added to the
    totals: a second reconciler that settles the same attempts between this pass's read and its write counts them,
    this pass does not."""
    _history(db, cfg)
    real, raced = tallies.attempt_tally, []

    def racing(run_dir, n, *args):
        if n == 2 and not raced:
            raced.append("other")
            raced.append(tallies.settle_tallies(db))  # the other pass: reads, tallies and writes in between
        return real(run_dir, n, *args)

    monkeypatch.setattr(tallies, "attempt_tally", racing)
    assert tallies.settle_tallies(db) == 0 and raced == ["other", 2]
    assert _measures(db) == (15, 2, 1, 3)
    assert _stored(db) == [(1, 0, 0, 0, None), (2, 10, 1, 1, ["preempted"]), (3, None, None, None, None)]


def test_a_stored_class_list_of_another_shape_is_skipped_not_a_traceback(db, cfg):
    _history(db, cfg)
    tallies.settle_tallies(db)
    with db.write() as s:  # a stored tally is not read back: the totals hold it
        get_job(s, "j").attempts[1].restart_classes = {"not": "a list"}
    assert _measures(db) == (15, 2, 1, 3)


def test_a_reconcile_pass_settles_the_ended_attempts(db, cfg, sched):
    from orchestrator.ops.reconcile import reconcile_pass

    _history(db, cfg)
    reconcile_pass(db, cfg, backend_for=lambda _n: sched)
    assert [row[2] is not None for row in _stored(db)][:2] == [True, True]



def test_the_quick_and_the_slow_metrics_paths_give_the_same_counts(db, cfg, sched):
    """`orch metrics` on SQLite reads through stdlib sqlite3 (importing SQLAlchemy was ~0.3 s of 0.5 s): the text
    generated from the same queries, the same snapshot."""
    from dataclasses import replace

    from orchestrator.ops.reconcile import reconcile_pass
    from orchestrator.views.metrics import quick_collect

    _history(db, cfg)
    reconcile_pass(db, cfg, backend_for=lambda _n: sched)  # settles, and stores the pass's stats
    slow, quick = collect(db), quick_collect(cfg)
    assert slow.last_pass is not None and slow.last_pass.passes_total == 1
    if db.engine.dialect.name != "sqlite":
        assert quick is None  # PostgreSQL: the slow path answers
        return
    assert quick is not None, "the quick path declined a private SQLite DB at the current revision"
    assert replace(quick, goodput=None) == replace(slow, goodput=None)  # goodput: live held time grows with now
    assert quick.goodput.keys() == slow.goodput.keys() and quick.redone_sum == 15


def test_a_tally_that_raises_is_a_pass_warning_and_recovery_goes_on(db, cfg, sched, monkeypatch):
    """Settling only counts: a surprise in it (here a TypeError) must not stop the pass that requeues jobs."""
    from orchestrator.ops.reconcile import reconcile_pass

    _history(db, cfg)

    def boom(*_a):
        raise TypeError("a row of another shape")

    monkeypatch.setattr(tallies, "attempt_tally", boom)
    rep = reconcile_pass(db, cfg, backend_for=lambda _n: sched)
    assert rep.ran and any("metrics tallies not settled: TypeError" in e for e in rep.errors), rep.errors
    assert _stored(db)[1][2] is None  # nothing settled: the next pass tries again
