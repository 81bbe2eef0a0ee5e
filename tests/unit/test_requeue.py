"""orchestrator.ops.requeue: the marker is verified before anything is cleared; only a requeueable job whose
attempts all ended gets a next attempt, and only one requeuer makes it (compare-and-set); ``--dry-run``
writes nothing. End to end with real processes and run dirs: tests/local/test_requeue_local.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from orchkit import pending_job

from orchestrator import protocol
from orchestrator.core.jobqueries import get_job
from orchestrator.core.lifecycle import AttemptState, JobState, utcnow
from orchestrator.core.models import Job
from orchestrator.ops.launch import launch
from orchestrator.ops.reconcile import reconcile_pass
from orchestrator.ops.requeue import RequeueOutcome, RequeueTarget, _own_reason, requeue

J, A, R = JobState, AttemptState, RequeueOutcome


def _submitted(db, cfg, sched, name: str) -> None:
    """A job whose attempt 1 was launched on the fake scheduler (as `orch submit` leaves it)."""
    pending_job(db, cfg, name, max_attempts=5)
    launch(db, cfg, name, sched)


def _failed(db, cfg, sched, name: str) -> None:
    """Attempt 1 exited 1 without a marker: the reconciler ends it, the job retryable_failed."""
    _submitted(db, cfg, sched, name)
    sched.ended[name] = 1
    reconcile_pass(db, cfg, lambda _n: sched)
    assert _job(db, name)[0] is J.RETRYABLE_FAILED


def _job(db, name: str):
    with db.read() as s:
        job = get_job(s, name)
        return job.state, [(a.n, a.state) for a in job.attempts]


def _verified(cfg, name: str) -> None:
    run_dir = cfg.runs_root / name
    (run_dir / "out.txt").write_text("result\n")
    protocol.write_done_marker(run_dir, name, 1, ["out.txt"])


@pytest.fixture
def no_auto(monkeypatch):
    """Reconcile passes that end attempts but requeue nothing by themselves: requeue's own calls are tested."""
    monkeypatch.setattr("orchestrator.ops.reconcile.requeue", lambda *a, **k: [])


def test_a_failed_job_gets_one_next_attempt_and_it_is_launched(db, cfg, sched, no_auto):
    _failed(db, cfg, sched, "f")
    [res] = requeue(db, cfg, RequeueTarget.named(["f"]))
    assert (res.outcome, res.attempt) == (R.REQUEUED, 2)
    assert _job(db, "f") == (J.SUBMITTED, [(1, A.FAILED), (2, A.SUBMITTED)])
    [again] = requeue(db, cfg, RequeueTarget.named(["f"]))  # attempt 2 is live: no third attempt
    assert again.outcome is R.REFUSED and again.reason.startswith("job is submitted;")
    assert _job(db, "f")[1] == [(1, A.FAILED), (2, A.SUBMITTED)]


def test_a_cancelled_job_whose_attempt_still_runs_is_refused_until_it_exited(db, cfg, sched, no_auto):
    from orchestrator.ops.cancel import cancel

    _submitted(db, cfg, sched, "c")
    cancel(db, cfg, ["c"])  # SIGTERM sent; the program is still checkpointing
    assert _job(db, "c") == (J.CANCELLED, [(1, A.STOPPING)])
    [res] = requeue(db, cfg, RequeueTarget.named(["c"]))
    assert res.outcome is R.REFUSED and "still stopping" in res.reason
    sched.ended["c"] = 143  # it exited: the requeue asks the backend once more and goes on
    [res] = requeue(db, cfg, RequeueTarget.named(["c"]))
    assert (res.outcome, res.attempt) == (R.REQUEUED, 2)


def test_a_failed_job_whose_marker_verifies_is_done_and_never_rerun(db, cfg, sched, no_auto):
    _failed(db, cfg, sched, "v")
    _verified(cfg, "v")
    [res] = requeue(db, cfg, RequeueTarget.named(["v"]))
    assert res.outcome is R.REFUSED and res.reason.startswith("verified")
    assert _job(db, "v") == (J.DONE, [(1, A.FAILED)])
    assert (cfg.runs_root / "v" / "out.txt").read_text() == "result\n"


def test_a_dry_run_says_what_it_would_do_and_writes_nothing(db, cfg, sched, no_auto):
    _failed(db, cfg, sched, "d")
    (cfg.runs_root / "d" / "out.txt").write_text("partial\n")  # an output without a verified marker
    [res] = requeue(db, cfg, RequeueTarget.named(["d"]), dry_run=True)
    assert (res.outcome, res.attempt) == (R.WOULD_REQUEUE, 2)
    assert "out.txt" in res.clears
    assert _job(db, "d") == (J.RETRYABLE_FAILED, [(1, A.FAILED)])
    assert (cfg.runs_root / "d" / "out.txt").read_text() == "partial\n"


def test_a_done_job_named_whose_marker_broke_is_unverified_and_requeued(db, cfg, sched, no_auto):
    _submitted(db, cfg, sched, "b")
    _verified(cfg, "b")
    sched.ended["b"] = 0
    reconcile_pass(db, cfg, lambda _n: sched)
    assert _job(db, "b")[0] is J.DONE
    assert requeue(db, cfg, RequeueTarget.failed()) == []  # --failed never looks at done jobs
    out = cfg.runs_root / "b" / "out.txt"
    data = bytearray(out.read_bytes())
    data[0] ^= 0x01  # a bit flip keeps the size
    out.write_bytes(bytes(data))
    [res] = requeue(db, cfg, RequeueTarget.named(["b"]))
    assert (res.outcome, res.attempt) == (R.REQUEUED, 2)
    assert _job(db, "b") == (J.SUBMITTED, [(1, A.SUCCEEDED), (2, A.SUBMITTED)])  # attempt 1 stays succeeded


def test_the_reconcilers_target_is_only_auto_requeue_jobs_whose_backoff_is_over(db, cfg, sched, no_auto):
    for name in ("now", "later", "manual"):
        _failed(db, cfg, sched, name)
    with db.write() as s:
        for name, auto, not_before in (("now", True, None), ("later", True, utcnow() + timedelta(hours=1)),
                                       ("manual", False, None)):
            job = get_job(s, name)
            s.query(Job).filter(Job.id == job.id).update({"auto_requeue": auto, "retry_not_before": not_before})
    assert [r.name for r in requeue(db, cfg, RequeueTarget.auto())] == ["now"]
    assert sorted(r.name for r in requeue(db, cfg, RequeueTarget.failed())) == ["later", "manual"]


def test_a_job_changed_by_another_requeuer_first_is_skipped_not_requeued_twice(db, cfg, sched, no_auto,
                                                                              monkeypatch):
    _failed(db, cfg, sched, "race")
    from orchestrator.ops import requeue as rq

    real = rq._LiveScan.in_run_dir

    def other_requeuer_first(self, run_dir):  # between the read and the write
        found = real(self, run_dir)
        requeue(db, cfg, RequeueTarget.named(["race"]))
        return found

    monkeypatch.setattr(rq._LiveScan, "in_run_dir", other_requeuer_first)
    [res] = requeue(db, cfg, RequeueTarget.named(["race"]))
    assert res.outcome is R.SKIPPED
    assert _job(db, "race")[1] == [(1, A.FAILED), (2, A.SUBMITTED)]  # one next attempt, not two


def test_a_launchers_refusal_reads_as_this_jobs_reason_once():
    assert _own_reason(Exception("refused: j: run dir is a symlink"), "j") == "run dir is a symlink"


def test_a_job_cancelled_while_the_reconciler_requeues_it_stays_cancelled(db, cfg, sched, no_auto, monkeypatch):
    # cancelled -> pending is an edge (a named requeue takes it), so the move's own compare-and-set would
    # let the reconciler's auto-requeue undo a user's `orch cancel` that landed between its read and write.
    from orchestrator.ops import requeue as rq
    from orchestrator.ops.cancel import cancel

    _failed(db, cfg, sched, "cx")
    with db.write() as s:
        s.query(Job).filter(Job.name == "cx").update({"auto_requeue": True})
    real = rq._LiveScan.in_run_dir

    def user_cancels_first(self, run_dir):
        found = real(self, run_dir)
        cancel(db, cfg, ["cx"])
        return found

    monkeypatch.setattr(rq._LiveScan, "in_run_dir", user_cancels_first)
    [res] = requeue(db, cfg, RequeueTarget.auto())
    assert res.outcome is R.SKIPPED
    assert _job(db, "cx") == (J.CANCELLED, [(1, A.FAILED)])
