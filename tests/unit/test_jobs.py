"""orchestrator.core.jobqueries: reading jobs -- lookup by name (one namespace with sweeps), a sweep's name expanded
to its tasks, the stored environment shared by equal environments, and an attempt's JSON view."""

from __future__ import annotations

import re

import pytest

from orchestrator.core.environments import environment_record
from orchestrator.core.jobqueries import attempt_view, expand_names, get_job, names_taken
from orchestrator.core.lifecycle import JobState
from orchestrator.core.transactions import environment_id
from orchestrator.errors import JobNotFound
from orchestrator.ops.cancel import cancel
from orchestrator.ops.statements import SessionExecutor
from orchestrator.ops.submit import SubmitRequest, submit
from orchestrator.ops.sweep import SweepRequest, submit_sweep


def test_get_job_finds_a_job_and_names_an_unknown_one(db, cfg, sched):
    submit(db, cfg, SubmitRequest(name="a", command=["true"]))
    with db.read() as s:
        assert get_job(s, "a").name == "a"
        with pytest.raises(JobNotFound, match=r"^no job named 'b'$"):
            get_job(s, "b")


def test_jobs_and_sweeps_share_one_namespace(db, cfg, sched):
    submit(db, cfg, SubmitRequest(name="j", command=["true"]))
    submit_sweep(db, cfg, SweepRequest(name="sw", command=["echo", "{x}"], params=[{"x": 1}, {"x": 2}]))
    with db.write() as s:
        assert names_taken(s, ["j", "sw", "free"]) == {"j", "sw"}


def test_a_sweep_name_expands_to_its_tasks_without_those_skipped_and_without_repeats(db, cfg, sched):
    submit(db, cfg, SubmitRequest(name="solo", command=["true"]))
    submit_sweep(db, cfg, SweepRequest(name="sw", command=["echo", "{x}"], params=[{"x": i} for i in range(3)]))
    with db.read() as s:
        tasks = expand_names(s, ["sw"])
        assert len(tasks) == 3 and all(t.startswith("sw") for t in tasks)
        assert expand_names(s, ["solo", "sw", "solo"]) == ["solo", *tasks]
    cancel(db, cfg, [tasks[0]])
    with db.read() as s:
        assert expand_names(s, ["sw"], skip=(JobState.CANCELLED,)) == tasks[1:]
        with pytest.raises(JobNotFound, match="no job named 'ghost'"):
            expand_names(s, ["solo", "ghost"])


def test_equal_environments_share_one_stored_row(db):
    with db.write() as s:
        a, b, c = (environment_id(SessionExecutor(s), *environment_record(env)) for env in (
            {"PATH": "/bin", "HOME": "/root"}, {"HOME": "/root", "PATH": "/bin"},  # same variables, other order
            {"PATH": "/usr/bin", "HOME": "/root"}))
    assert a == b != c


def test_the_attempt_view_has_the_contract_fields_and_utc_times(db, cfg, sched):
    submit(db, cfg, SubmitRequest(name="v", command=["true"]))
    with db.read() as s:
        a = get_job(s, "v").attempts[0]
        view = attempt_view(a)
    assert {"n", "backend", "external_id", "state", "failure_class", "action", "counted", "restarts", "token",
            "submitted_at", "ended_at"} <= view.keys()
    assert (view["n"], view["backend"], view["state"]) == (1, "local", "submitted")
    assert view["external_id"] == f"fake-{sched.tokens['v']}" and view["ended_at"] is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", view["submitted_at"]), view["submitted_at"]
