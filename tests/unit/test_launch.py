"""orchestrator.ops.launch: a pending attempt is claimed, its run dir checked and prepared, and submitted once; a run
dir that verified before the backend call closes the attempt unlaunched. Races between launchers:
tests/adversarial/test_launch_races.py and tests/unit/test_exactly_once_guards.py."""

from __future__ import annotations

import os

from orchkit import pending_job

from orchestrator import protocol
from orchestrator.core.jobqueries import get_job
from orchestrator.core.lifecycle import AttemptState, JobState
from orchestrator.ops.launch import LaunchOutcome, launch


def _states(db, name: str):
    with db.read() as s:
        job = get_job(s, name)
        return job.state, job.attempts[-1].state, job.attempts[-1].external_id


def test_a_pending_attempt_is_submitted_once_and_recorded(db, cfg, sched):
    pending_job(db, cfg, "a")
    calls = []
    real = sched.submit
    sched.submit = lambda spec: calls.append(spec.token) or real(spec)
    out = launch(db, cfg, "a", sched)
    assert out.outcome is LaunchOutcome.SUBMITTED and len(calls) == 1
    assert _states(db, "a") == (JobState.SUBMITTED, AttemptState.SUBMITTED, f"fake-{calls[0]}")
    again = launch(db, cfg, "a", sched)  # nothing pending any more: no second submission
    assert again.external_id is None and len(calls) == 1


def test_a_run_dir_that_verified_before_the_backend_call_closes_the_attempt_unlaunched(db, cfg, sched):
    pending_job(db, cfg, "v")
    run_dir = cfg.runs_root / "v"
    (run_dir / "out.txt").write_text("done\n")
    protocol.write_done_marker(run_dir, "v", 1, ["out.txt"])
    sched.submit = lambda spec: (_ for _ in ()).throw(AssertionError("submitted a verified job"))
    assert launch(db, cfg, "v", sched).outcome is LaunchOutcome.VERIFIED
    # The job is done by its marker; the attempt never ran, so it did not succeed: closed as cancelled.
    assert _states(db, "v") == (JobState.DONE, AttemptState.CANCELLED, None)


def test_an_io_error_while_the_run_dir_is_prepared_is_a_storage_fault_requeued_by_itself(db, cfg, sched, monkeypatch):
    """An EIO writing the attempt's records (NFS, a failing disk) ended the attempt `unknown`, which waits
    for a person; EACCES still does (it will not pass by itself)."""
    import errno

    import pytest

    from orchestrator.errors import OrchError
    from orchestrator.ops import launch as launch_mod

    for name, code, cls, auto in (("eio", errno.EIO, "storage", True), ("eacces", errno.EACCES, "unknown", False)):
        pending_job(db, cfg, name)

        def failing(*_a, code=code, **_kw):
            raise OSError(code, os.strerror(code), "attempts/1/command.json")

        monkeypatch.setattr(launch_mod, "check_and_prepare", failing)
        with pytest.raises(OrchError, match="launch failed"):
            launch(db, cfg, name, sched)
        with db.read() as s:
            job = get_job(s, name)
            a = job.attempts[-1]
            assert (a.failure_class, job.state, a.action.auto) == (cls, JobState.RETRYABLE_FAILED, auto), name
            assert a.counted is (cls != "storage"), name
