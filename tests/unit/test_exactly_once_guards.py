"""Exactly-once submission guards: a launcher's claim, and "unknown" never read as "not submitted"."""

from __future__ import annotations

from orchestrator.backends.base import Backend, BackendError, Outcome, Phase
from orchestrator.core.lifecycle import utcnow
from orchestrator.core.models import Attempt, Job
from orchestrator.ops.launch import launch
from orchestrator.ops.reconcile import reconcile_pass


class CountingBackend(Backend):
    name = "local"

    def __init__(self, find_fails: bool = False) -> None:
        self.submits: list[str] = []
        self.find_fails = find_fails

    def submit(self, spec):
        self.submits.append(spec.token)
        return f"ext-{len(self.submits)}"

    def poll(self, refs):
        return {r.token: Outcome(Phase.RUNNING) for r in refs}

    def cancel(self, refs):
        pass

    def find_by_token(self, refs):
        if self.find_fails:
            raise BackendError("sacct: Problem talking to the database")
        return {}


def _pending_job(db, cfg, name: str = "j", *, claimed: bool = False) -> None:
    """A job whose first attempt is pending, or (``claimed``) launching: a launcher claimed it and
    may be inside its backend call (or died there)."""
    with db.write() as s:
        job = Job(name=name, state="pending", backend="local", run_dir=str(cfg.runs_root / name),
                  command=["true"])
        s.add(job)
        s.flush()
        s.add(Attempt(job_id=job.id, n=1, token="tok-" + name, state="launching" if claimed else "pending",
                      claimed_at=utcnow() if claimed else None, backend="local"))


def test_a_failed_token_lookup_never_resubmits(db, cfg, monkeypatch):
    monkeypatch.setenv("ORCH_LAUNCH_GRACE_S", "0")
    _pending_job(db, cfg, claimed=True)  # its launcher died inside the backend call
    backend = CountingBackend(find_fails=True)
    rep = reconcile_pass(db, cfg, backend_for=lambda _n: backend)
    assert backend.submits == [], "an unanswered lookup was taken for 'never submitted'"
    assert any("Problem talking to the database" in e for e in rep.errors)
    with db.read() as s:
        assert s.query(Attempt).one().state == "launching"


def test_an_answered_empty_lookup_submits_exactly_once(db, cfg, monkeypatch):
    monkeypatch.setenv("ORCH_LAUNCH_GRACE_S", "0")
    _pending_job(db, cfg, claimed=True)
    backend = CountingBackend()
    reconcile_pass(db, cfg, backend_for=lambda _n: backend)
    reconcile_pass(db, cfg, backend_for=lambda _n: backend)
    assert backend.submits == ["tok-j"]


def test_a_pending_attempt_nobody_claimed_is_launched_once_without_a_lookup(db, cfg, monkeypatch):
    # The submitter died between the row and its claim: nothing can have reached the backend.
    monkeypatch.setenv("ORCH_LAUNCH_GRACE_S", "0")
    _pending_job(db, cfg)
    backend = CountingBackend(find_fails=True)
    reconcile_pass(db, cfg, backend_for=lambda _n: backend)
    reconcile_pass(db, cfg, backend_for=lambda _n: backend)
    assert backend.submits == ["tok-j"]


def test_a_second_launcher_loses_the_claim(db, cfg, monkeypatch):
    monkeypatch.setenv("ORCH_LAUNCH_GRACE_S", "600")
    _pending_job(db, cfg, claimed=True)  # a first launcher claimed it and is still inside its backend call
    backend = CountingBackend()
    launch(db, cfg, "j", backend)
    launch(db, cfg, "j", backend, reclaim=True)  # not even a re-claim while the claim is fresh
    assert backend.submits == []
    with db.read() as s:
        assert s.query(Attempt).one().state == "launching"
