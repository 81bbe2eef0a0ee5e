"""The two state machines (``orchestrator.core.lifecycle``) and their only writers, ``move_job`` and
``move_attempt`` (compare-and-set; a job move also writes an event row)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.core.jobqueries import get_job
from orchestrator.core.lifecycle import (
    ATTEMPT_ENDED,
    ATTEMPT_LIVE,
    ATTEMPT_TRANSITIONS,
    TERMINAL,
    TRANSITIONS,
    AttemptState,
    JobState,
    can_move_attempt,
    can_transition,
    move_attempt,
    move_job,
)
from orchestrator.core.models import Attempt, Event, Job
from orchestrator.errors import IllegalTransition

transition = move_job
ROOT = Path(__file__).resolve().parents[2]

# The contract's state strings, exactly.
CONTRACT_STATES = {"pending", "submitted", "running", "done_marker_verified", "retryable_failed", "failed",
                   "cancelled"}

# Every allowed edge, written out by hand. Adding a state or an edge to states.TRANSITIONS without
# updating this list (and thinking about why) fails test_transition_table_is_exactly_these_edges.
EDGES = {
    ("pending", "submitted"),
    ("pending", "retryable_failed"),
    ("pending", "failed"),
    ("pending", "cancelled"),
    ("pending", "done_marker_verified"),
    ("submitted", "running"),
    ("submitted", "done_marker_verified"),
    ("submitted", "retryable_failed"),
    ("submitted", "failed"),
    ("submitted", "cancelled"),
    ("running", "submitted"),
    ("running", "done_marker_verified"),
    ("running", "retryable_failed"),
    ("running", "failed"),
    ("running", "cancelled"),
    ("retryable_failed", "pending"),
    ("retryable_failed", "failed"),
    ("retryable_failed", "cancelled"),
    ("retryable_failed", "done_marker_verified"),
    ("failed", "pending"),
    ("failed", "done_marker_verified"),
    ("cancelled", "pending"),
    ("cancelled", "done_marker_verified"),
    ("done_marker_verified", "retryable_failed"),  # only `orch requeue NAME` whose re-verification failed
}


def test_job_states_are_exactly_the_contract_strings():
    assert {s.value for s in JobState} == CONTRACT_STATES


def test_every_state_has_a_row_in_the_transition_table():
    assert set(TRANSITIONS) == set(JobState)
    for dsts in TRANSITIONS.values():
        assert all(isinstance(d, JobState) for d in dsts)


def test_transition_table_is_exactly_these_edges():
    actual = {(src.value, dst.value) for src, dsts in TRANSITIONS.items() for dst in dsts}
    assert actual - EDGES == set(), "edges in the table that this test does not list"
    assert EDGES - actual == set(), "edges this test lists that the table lacks"
    for src in JobState:
        for dst in JobState:
            assert can_transition(src, dst) == ((src.value, dst.value) in EDGES)


def test_done_marker_verified_is_the_only_terminal_state():
    assert TERMINAL == {JobState.DONE}
    # Its one edge out: an explicit requeue that verified the marker again and found it broken.
    assert TRANSITIONS[JobState.DONE] == frozenset({JobState.RETRYABLE_FAILED})
    assert all(TRANSITIONS[s] for s in JobState if s is not JobState.DONE)


def test_no_state_moves_to_itself():
    assert all(s not in TRANSITIONS[s] for s in JobState)


# Every allowed attempt edge, written out by hand (see ATTEMPT_TRANSITIONS for the event of each).
ATTEMPT_EDGES = {
    ("pending", "launching"), ("pending", "cancelled"),
    ("launching", "launching"), ("launching", "submitted"), ("launching", "failed"), ("launching", "stopping"),
    ("launching", "cancelled"),
    ("submitted", "running"), ("submitted", "stopping"), ("submitted", "succeeded"), ("submitted", "failed"),
    ("submitted", "cancelled"),  # scancel outside orch: it used to be no edge, and the attempt stayed running
    ("running", "submitted"), ("running", "stopping"), ("running", "succeeded"), ("running", "failed"),
    ("running", "cancelled"),
    ("stopping", "succeeded"), ("stopping", "failed"), ("stopping", "cancelled"),
}


def test_attempt_transition_table_is_exactly_these_edges():
    actual = {(src.value, dst.value) for src, dsts in ATTEMPT_TRANSITIONS.items() for dst in dsts}
    assert set(ATTEMPT_TRANSITIONS) == set(AttemptState)
    assert actual == ATTEMPT_EDGES
    for src in AttemptState:
        for dst in AttemptState:
            assert can_move_attempt(src, dst) == ((src.value, dst.value) in ATTEMPT_EDGES)


def test_attempt_sets_derive_from_the_table():
    assert ATTEMPT_ENDED == {AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELLED}
    # every live state can still end, and nothing ended is live
    assert not ATTEMPT_LIVE & ATTEMPT_ENDED
    for s in ATTEMPT_LIVE:
        assert ATTEMPT_TRANSITIONS[s] & ATTEMPT_ENDED, s


def _job_in(db, state: JobState, name: str) -> None:
    with db.write() as s:
        s.add(Job(name=name, state=state, backend="local", run_dir=f"/nowhere/{name}", command=["true"]))


def test_walk_every_job_edge_and_every_non_edge(db):
    # Each allowed edge moves the row and writes one event; each other pair is refused untouched.
    for i, (src, dst) in enumerate((a, b) for a in JobState for b in JobState):
        name = f"j{i}"
        _job_in(db, src, name)
        if can_transition(src, dst):
            with db.write() as s:
                move_job(s, get_job(s, name), dst, "walk")
            assert _events(db, name) == [(src.value, dst.value, "walk")]
            with db.read() as s:
                assert get_job(s, name).state is dst
        else:
            with pytest.raises(IllegalTransition), db.write() as s:
                move_job(s, get_job(s, name), dst)
            with db.read() as s:
                assert get_job(s, name).state is src
            assert _events(db, name) == []


def test_walk_every_attempt_edge_and_every_non_edge(db):
    _job_in(db, JobState.RUNNING, "host")
    with db.read() as s:
        job_id = get_job(s, "host").id
    for i, (src, dst) in enumerate((a, b) for a in AttemptState for b in AttemptState):
        with db.write() as s:
            a = Attempt(job_id=job_id, n=i + 1, token=f"t{i}", state=src, backend="local")
            s.add(a)
        with db.write() as s:
            a = s.get(Attempt, a.id)
            if can_move_attempt(src, dst):
                move_attempt(s, a, dst, detail="walk")
            else:
                with pytest.raises(IllegalTransition):
                    move_attempt(s, a, dst)
        with db.read() as s:
            got = s.get(Attempt, a.id)
            assert got.state is (dst if can_move_attempt(src, dst) else src), (src, dst)
            assert (got.ended_at is not None) == (can_move_attempt(src, dst) and dst in ATTEMPT_ENDED)


def test_a_stale_attempt_mover_loses_to_the_first(db):
    _job_in(db, JobState.PENDING, "j")
    with db.write() as s:
        s.add(Attempt(job_id=get_job(s, "j").id, n=1, token="t", state=AttemptState.PENDING, backend="local"))
    with db.read() as s:
        first, second = s.scalar(select(Attempt)), s.scalar(select(Attempt))
    with db.write() as s:
        move_attempt(s, first, AttemptState.LAUNCHING)
    with db.read() as s:
        second = s.scalar(select(Attempt).where(Attempt.id == first.id))
    second.state = AttemptState.PENDING  # what a second launcher read before the first one moved it
    with pytest.raises(IllegalTransition, match="state changed under us"), db.write() as s:
        move_attempt(s, second, AttemptState.LAUNCHING)


# The AST check that no other module writes a state or constructs a row: tests/unit/test_lifecycle_data.py.


# ------------------------------------------------------------------------------------------
# transition(): compare-and-set with an event row in the same transaction
# ------------------------------------------------------------------------------------------
def _make_job(db, name: str = "j", state: JobState = JobState.RETRYABLE_FAILED) -> None:
    with db.write() as s:
        s.add(Job(name=name, state=state, backend="local", run_dir=f"/nowhere/{name}", command=["true"]))


def _events(db, name: str) -> list[tuple[str | None, str, str]]:
    with db.read() as s:
        job = get_job(s, name)
        return [(e.from_state, e.to_state, e.reason)
                for e in s.scalars(select(Event).where(Event.job_id == job.id).order_by(Event.id))]


def test_two_readers_of_the_same_job_only_the_first_transition_wins(db):
    _make_job(db)
    with db.read() as s:
        seen_by_a = get_job(s, "j")
    with db.read() as s:
        seen_by_b = get_job(s, "j")
    assert seen_by_a.state == seen_by_b.state == "retryable_failed"

    with db.write() as s:
        transition(s, seen_by_a, JobState.PENDING, "requeue by A")
    with pytest.raises(IllegalTransition, match="state changed under us"), db.write() as s:
        transition(s, seen_by_b, JobState.PENDING, "requeue by B")

    with db.read() as s:
        assert get_job(s, "j").state == "pending"
    assert _events(db, "j") == [("retryable_failed", "pending", "requeue by A")]


def test_loser_of_the_race_cannot_take_a_different_edge_either(db):
    # B read retryable_failed; A moved it to pending. B's stale "retryable_failed -> cancelled" is
    # legal in the table but must still lose: the row is no longer in the state B read.
    _make_job(db)
    with db.read() as s:
        a, b = get_job(s, "j"), None
    with db.read() as s:
        b = get_job(s, "j")
    with db.write() as s:
        transition(s, a, JobState.PENDING)
    with pytest.raises(IllegalTransition), db.write() as s:
        transition(s, b, JobState.CANCELLED)
    with db.read() as s:
        assert get_job(s, "j").state == "pending"


def test_illegal_edge_is_refused_before_touching_the_row(db):
    _make_job(db, state=JobState.DONE)
    with pytest.raises(IllegalTransition, match="done_marker_verified -> pending is not allowed"), \
            db.write() as s:
        transition(s, get_job(s, "j"), JobState.PENDING)
    with db.read() as s:
        assert get_job(s, "j").state == "done_marker_verified"
    assert _events(db, "j") == []


def test_state_change_and_event_row_commit_or_roll_back_together(db):
    _make_job(db)
    with pytest.raises(RuntimeError, match="crash after transition"), db.write() as s:
        transition(s, get_job(s, "j"), JobState.PENDING, "will be rolled back")
        raise RuntimeError("crash after transition")
    with db.read() as s:
        assert get_job(s, "j").state == "retryable_failed"
    assert _events(db, "j") == []

    with db.write() as s:
        transition(s, get_job(s, "j"), JobState.PENDING, "kept")
    assert _events(db, "j") == [("retryable_failed", "pending", "kept")]
