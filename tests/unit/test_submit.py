"""orchestrator.ops.submit: a job is created with its first attempt and launched, or refused with nothing written
(a verified run dir is never rerun; a name is never taken twice). The CLI's refusals end to end:
tests/adversarial/test_strict_cli.py, tests/local/test_wrapper_guard.py."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from orchestrator import protocol
from orchestrator.core.lifecycle import AttemptState, JobState
from orchestrator.core.models import Attempt, Job
from orchestrator.errors import AlreadyVerified, Refused
from orchestrator.ops.submit import SubmitRequest, submit


def _rows(db) -> tuple[int, int]:
    with db.read() as s:
        return s.scalar(select(func.count(Job.id))), s.scalar(select(func.count(Attempt.id)))


def test_a_submitted_job_has_one_attempt_launched_on_its_backend(db, cfg, sched):
    job = submit(db, cfg, SubmitRequest(name="a", command=["python", "train.py"]))
    assert job.state is JobState.SUBMITTED and [a.n for a in job.attempts] == [1]
    assert job.attempts[0].state is AttemptState.SUBMITTED and job.attempts[0].external_id
    assert job.run_dir == str(cfg.runs_root / "a") and _rows(db) == (1, 1)


def test_a_run_dir_holding_a_verified_marker_is_refused_and_nothing_is_written(db, cfg, sched):
    run_dir = cfg.runs_root / "done"
    run_dir.mkdir(parents=True)
    (run_dir / "out.txt").write_text("result\n")
    protocol.write_done_marker(run_dir, "done", 1, ["out.txt"])
    with pytest.raises(AlreadyVerified, match="holds a verified done marker"):
        submit(db, cfg, SubmitRequest(name="done", command=["true"]))
    assert _rows(db) == (0, 0) and protocol.verify_done_marker(run_dir).verified


def test_a_name_already_taken_is_refused_and_the_first_job_is_untouched(db, cfg, sched):
    first = submit(db, cfg, SubmitRequest(name="b", command=["true"]))
    with pytest.raises(Refused, match="already exists"):
        submit(db, cfg, SubmitRequest(name="b", command=["false"]))
    with db.read() as s:
        job = s.scalar(select(Job).where(Job.name == "b"))
        assert job.command == ["true"] and job.id == first.id
    assert _rows(db) == (1, 1)
