"""orchestrator.ops.cancel (``orch cancel``): the job is cancelled at once; a launched attempt enters the stop
sequence (stopping, reason cancel, its time) and the backend is told once per backend; an attempt that never
launched ends cancelled; unknown names change nothing; a backend that cannot be told is said, not hidden.
In-process on a real DB, a fake only at the scheduler boundary."""

from __future__ import annotations

import pytest

from orchestrator.backends.base import BackendError
from orchestrator.core.jobqueries import get_job
from orchestrator.core.lifecycle import AttemptState, JobState
from orchestrator.errors import JobNotFound
from orchestrator.ops.cancel import cancel
from orchestrator.ops.reconcile import reconcile_pass
from orchestrator.ops.submit import SubmitRequest, submit


def _running(db, cfg, sched, *names: str) -> None:
    for n in names:
        submit(db, cfg, SubmitRequest(name=n, command=["true"]))
    reconcile_pass(db, cfg, backend_for=lambda _n: sched)


def _attempt(db, name: str):
    with db.read() as s:
        a = get_job(s, name).attempts[-1]
        return a.state, a.stop_reason, a.stop_requested_at, a.failure_class, get_job(s, name).state


def test_cancel_moves_the_job_at_once_and_its_running_attempt_into_the_stop_sequence(db, cfg, sched):
    _running(db, cfg, sched, "a", "b")
    assert _attempt(db, "a")[0] is AttemptState.RUNNING
    assert cancel(db, cfg, ["a", "b"]) == [("a", "cancelled"), ("b", "cancelled")]
    for n in ("a", "b"):
        state, reason, at, cls, job_state = _attempt(db, n)
        assert (state, reason, job_state) == (AttemptState.STOPPING, "cancel", JobState.CANCELLED)
        assert at is not None and cls is None  # the reconciler ends it once the backend says it is gone
    assert sched.cancelled == [["a", "b"]]  # one call for every attempt of one backend


def test_cancel_of_an_attempt_that_never_launched_ends_it_cancelled_without_the_backend(db, cfg, sched,
                                                                                        monkeypatch):
    monkeypatch.setattr("orchestrator.ops.submit.launch", lambda *a, **k: None)  # the attempt row, no launch yet
    submit(db, cfg, SubmitRequest(name="p", command=["true"]))
    assert _attempt(db, "p")[0] is AttemptState.PENDING
    assert cancel(db, cfg, ["p"]) == [("p", "cancelled")]
    state, _reason, _at, cls, job_state = _attempt(db, "p")
    assert (state, cls and cls.value, job_state) == (AttemptState.CANCELLED, "cancelled", JobState.CANCELLED)
    assert sched.cancelled == []


def test_cancel_of_an_ended_job_changes_nothing(db, cfg, sched):
    _running(db, cfg, sched, "x")
    cancel(db, cfg, ["x"])
    before = _attempt(db, "x")
    assert cancel(db, cfg, ["x"]) == [("x", "not cancelled: job is cancelled")]
    assert _attempt(db, "x") == before and sched.cancelled == [["x"]]  # the backend is not told again


def test_an_unknown_name_fails_before_anything_changes(db, cfg, sched):
    _running(db, cfg, sched, "known")
    with pytest.raises(JobNotFound, match="no job named 'nope'"):
        cancel(db, cfg, ["known", "nope"])
    assert _attempt(db, "known")[0] is AttemptState.RUNNING and sched.cancelled == []


def test_a_backend_that_cannot_be_told_is_reported_per_job(db, cfg, sched):
    _running(db, cfg, sched, "j")
    sched.cancel_error = BackendError("scancel: connection refused")
    (name, what), = cancel(db, cfg, ["j"])
    assert name == "j" and what.startswith("cancelled in orch, but the backend was not told (scancel: connection")
    assert what.endswith("stop it by hand")
    assert _attempt(db, "j")[4] is JobState.CANCELLED


def test_a_cancel_of_a_launching_attempt_revokes_its_fence_and_writes_nowhere_else(db, cfg, tmp_path):
    """A wrapper started by a launch that a cancel overtook runs nothing: the cancel writes the attempt's fence file
    to generation 0 (no claim has it) in its transaction. Only for a launching attempt, only in a real attempts/."""
    import json

    from orchkit import pending_job
    from sqlalchemy import update

    from orchestrator import protocol
    from orchestrator.core.lifecycle import AttemptState
    from orchestrator.core.models import Attempt
    from orchestrator.ops.cancel import cancel

    for name in ("l", "p", "s"):
        pending_job(db, cfg, name)
        (cfg.runs_root / name / "attempts" / "1").mkdir(parents=True)
        protocol.write_fence(cfg.runs_root / name / "attempts" / "1", f"tok-{name}", 3)
    with db.write() as s:
        for name, state in (("l", AttemptState.LAUNCHING), ("s", AttemptState.SUBMITTED)):
            s.execute(update(Attempt).where(Attempt.job_id == get_job(s, name).id).values(
                state=state, fence=3, external_id="x" if name == "s" else None))
    # a hostile attempts/ of its own: never written through
    pending_job(db, cfg, "h")
    (tmp_path / "else").mkdir()
    (cfg.runs_root / "h" / "attempts").symlink_to(tmp_path / "else")
    with db.write() as s:
        s.execute(update(Attempt).where(Attempt.job_id == get_job(s, "h").id).values(state=AttemptState.LAUNCHING))
    cancel(db, cfg, ["l", "p", "s", "h"])

    def fence(name: str) -> int:
        return json.loads((cfg.runs_root / name / "attempts" / "1" / "fence.json").read_text())["fence"]

    assert protocol.read_fence(cfg.runs_root / "l" / "attempts" / "1") == (
        get_job_token(db, "l"), 0)  # revoked, under the attempt's own token
    assert fence("p") == 3 and fence("s") == 3  # not launching: untouched
    assert list((tmp_path / "else").iterdir()) == []


def get_job_token(db, name: str) -> str:
    with db.read() as s:
        return get_job(s, name).attempts[-1].token
