"""The one state table and its only writer, ``jobs.transition`` (compare-and-set + event row)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from orchestrator.errors import IllegalTransition
from orchestrator.jobs import get_job, transition
from orchestrator.models import Event, Job
from orchestrator.states import TERMINAL, TRANSITIONS, JobState, can_transition

# The contract's state strings, exactly.
CONTRACT_STATES = {"pending", "submitted", "running", "done_marker_verified", "retryable_failed", "failed",
                   "cancelled"}

# Every allowed edge, written out by hand. Adding a state or an edge to states.TRANSITIONS without
# updating this list (and thinking about why) fails test_transition_table_is_exactly_these_edges.
EDGES = {
    ("pending", "submitted"),
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
    assert TRANSITIONS[JobState.DONE] == frozenset()
    assert all(TRANSITIONS[s] for s in JobState if s is not JobState.DONE)


def test_no_state_moves_to_itself():
    assert all(s not in TRANSITIONS[s] for s in JobState)


# ------------------------------------------------------------------------------------------
# transition(): compare-and-set with an event row in the same transaction
# ------------------------------------------------------------------------------------------
def _make_job(db, name: str = "j", state: JobState = JobState.RETRYABLE_FAILED) -> None:  # noqa: ANN001
    with db.write() as s:
        s.add(Job(name=name, state=state.value, backend="local", run_dir=f"/nowhere/{name}",
                  command_json='["true"]'))


def _events(db, name: str) -> list[tuple[str | None, str, str]]:  # noqa: ANN001
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
