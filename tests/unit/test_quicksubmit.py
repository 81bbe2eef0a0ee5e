"""orchestrator.ops.quicksubmit: ``orch submit`` without SQLAlchemy (to stay <= 250 ms per call) writes what the
SQLAlchemy path writes, runs only where the gate lets it, and hands every deviation to launch's own handler.

The rows of a quick submission are compared with a slow one's column by column (its SQL is generated from the
models: tests/unit/test_sqlitetext.py); each deviation (a claim taken first, a cancel during the launch, a claim lost
before the backend call or before the record, a refusal while preparing, a failed backend call) is made to
happen for real in the DB and the outcome checked against what ``launch`` decides."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from orchkit import assert_launch_times, at_site
from sqlalchemy import select, update

from orchestrator.backends.base import BackendError, SubmissionRefused
from orchestrator.core.jobqueries import get_job
from orchestrator.core.lifecycle import AttemptState, JobState, utcnow
from orchestrator.core.models import Attempt, Event, Job
from orchestrator.errors import OrchError, Refused
from orchestrator.ops import quicksubmit
from orchestrator.ops.submit import SubmitRequest, submit

ROOT = Path(__file__).resolve().parents[2]
# Differ by design between two submissions: identities, times, the token, and the backend's id.
PER_ROW = {"id", "job_id", "name", "run_dir", "token", "created_at", "updated_at", "claimed_at", "submitted_at",
           "external_id"}


def _quick(cfg, name: str, command: list[str] | None = None, **kw) -> quicksubmit.Submitted:
    out = quicksubmit.submit(cfg, name, command or ["python", "train.py", "--lr", "0.1"], kw.pop("backend", "local"),
                             kw.pop("resources", {"partition": "spot", "time_limit": "01:00:00"}), 5,
                             kw.pop("outputs", ["model.pt"]))
    assert out is not None, "the gate refused a DB the SQLAlchemy path had just created"
    return out


def _rows(db, name: str, since: datetime) -> tuple[dict, list[dict], list[tuple]]:
    """The job's rows less what differs by design; its times checked for order and for falling since ``since``."""
    with db.read() as s:
        job = get_job(s, name)
        assert_launch_times(job, since, utcnow())
        j = {c.key: getattr(job, c.key) for c in Job.__mapper__.column_attrs if c.key not in PER_ROW}
        attempts = [{c.key: getattr(a, c.key) for c in Attempt.__mapper__.column_attrs if c.key not in PER_ROW}
                    for a in job.attempts]
        ext = job.attempts[-1].external_id or "-"
        events = [(e.attempt_id is None, e.from_state, e.to_state, e.reason.replace(ext, "ID"))
                  for e in s.scalars(select(Event).where(Event.job_id == job.id).order_by(Event.id))]
    return j, attempts, events


def test_a_quick_submission_writes_the_rows_the_sqlalchemy_path_writes(db, cfg, sched):
    since = utcnow()
    quick = _quick(cfg, "quick")  # first: its environment row is the one the slow path then finds by its digest
    slow = submit(db, cfg, SubmitRequest(name="slow", command=["python", "train.py", "--lr", "0.1"],
                                         resources={"partition": "spot", "time_limit": "01:00:00"}, max_attempts=5,
                                         outputs=["model.pt"]))
    assert quick.external_id == f"fake-{sched.tokens['quick']}" and quick.run_dir == cfg.runs_root / "quick"
    assert slow.state is JobState.SUBMITTED
    assert _rows(db, "quick", since) == _rows(db, "slow", since)
    with db.read() as s:
        spec_env = get_job(s, "quick").environment.vars
    assert spec_env == dict(sorted(os.environ.items()))  # the environment row shared with the slow submission


def test_the_mtbf_and_suspect_evidence_read_quickly_equal_the_slow_reads(db, cfg, sched):
    """Ended attempts with nodes and classes, read by both paths: the same M and the same suspects."""
    from datetime import timedelta

    from orchestrator.core.lifecycle import utcnow
    from orchestrator.core.quickdb import QuickDB
    from orchestrator.decide import mtbf, suspects

    for i, cls in enumerate(["killed", "crash", "preempted", "node_fail"]):
        submit(db, cfg, SubmitRequest(name=f"h{i}", command=["true"], backend="slurm",
                                      resources={"partition": "spot"}))
        with db.write() as s:
            s.execute(update(Attempt).where(Attempt.job_id == get_job(s, f"h{i}").id).values(
                state=AttemptState.FAILED, failure_class=cls, nodes="n[1-2]",
                started_at=utcnow() - timedelta(hours=2), ended_at=utcnow() - timedelta(minutes=i)))
    mtbf._cache.clear()  # the submits above cached the empty history
    with db.read() as s:
        slow_env = mtbf.mtbf_env(s, "slurm", {"partition": "spot"})
    mtbf._cache.clear()
    qdb = QuickDB.open(cfg)
    try:
        with qdb.read() as c:
            quick_env = mtbf.mtbf_env_from(lambda cutoff: quicksubmit.history(c, "slurm", cutoff), "slurm",
                                           {"partition": "spot"})
    finally:
        qdb.close()
    mtbf._cache.clear()
    assert quick_env == slow_env and "2 unwarned failure(s)" in slow_env[mtbf.ENV_MTBF_SOURCE]

    class Slurm:  # the backend as the exclusion asks it: its name and which nodes a job could use
        name = "slurm"
        capabilities = type("C", (), {"node_exclusion": True})()

        @staticmethod
        def usable_nodes(_resources):
            return frozenset({"n1", "n2", "n3", "n4"})

        @staticmethod
        def own_node_choice(_resources):
            return None

    spec = type("S", (), {"resources": __import__("orchestrator.core.resources").core.resources.resources_of({})})()
    cfg2 = __import__("dataclasses").replace(cfg, suspect_failures=2)
    slow = suspects.current_suspects(db, cfg2, "slurm")
    qdb = QuickDB.open(cfg)
    try:
        import dataclasses

        spec = dataclasses.replace(quicksubmit.make_spec(
            cfg, job="x", attempt=1, token="t", run_dir=str(cfg.runs_root / "x"), argv=["true"], outputs=[], env={},
            resources={}, task=None, base_env=None))
        quick = quicksubmit._with_exclusion(qdb, cfg2, Slurm(), spec)
    finally:
        qdb.close()
    assert sorted(slow) == ["n1", "n2"] and sorted(quick.exclude_nodes) == ["n1", "n2"]


def test_the_gate_sends_a_db_it_would_have_to_change_to_the_slow_path_and_writes_nothing(db, cfg, sched):
    from orchestrator.core.config import sqlite_path

    path = sqlite_path(cfg.db_url)
    os.chmod(path, 0o644)  # readable by others: the slow path tightens it first
    assert quicksubmit.submit(cfg, "a", ["true"], "local", {}, 3, []) is None
    os.chmod(path, 0o600)
    with db.write() as s:  # an older revision: the slow path upgrades it first
        s.execute(__import__("sqlalchemy").text("UPDATE alembic_version SET version_num = '0009'"))
    assert quicksubmit.submit(cfg, "a", ["true"], "local", {}, 3, []) is None
    with db.write() as s:
        s.execute(__import__("sqlalchemy").text("UPDATE alembic_version SET version_num = '0010'"))
        assert s.scalar(select(Job.id)) is None
    assert not (cfg.runs_root / "a").exists() and sched.tokens == {}


def test_a_cancel_during_the_quick_launch_closes_the_attempt_unlaunched(db, cfg, sched, monkeypatch):
    from orchestrator.ops.cancel import cancel
    from orchestrator.ops.launch import LaunchOutcome

    at_site(monkeypatch, "before_backend_submit", lambda: cancel(db, cfg, ["c"]))
    out = _quick(cfg, "c")
    assert out.external_id is None and out.launched.outcome is LaunchOutcome.STOPPED
    with db.read() as s:
        a = get_job(s, "c").attempts[-1]
        assert a.state is AttemptState.CANCELLED and a.external_id is None
    assert "c" not in sched.tokens  # never submitted


def test_a_claim_lost_before_the_backend_call_submits_nothing(db, cfg, sched, monkeypatch):
    from orchestrator.ops.launch import LaunchOutcome

    def reclaimed() -> None:  # a reconciler re-claimed the launch (this one stalled past the grace)
        with db.write() as s:
            s.execute(update(Attempt).values(fence=Attempt.fence + 1))

    at_site(monkeypatch, "before_backend_submit", reclaimed)
    out = _quick(cfg, "l")
    assert out.launched.outcome is LaunchOutcome.LOST_CLAIM and "l" not in sched.tokens
    with db.read() as s:
        a = get_job(s, "l").attempts[-1]
        assert a.state is AttemptState.LAUNCHING and a.fence == 2 and a.launched_fence is None


def test_a_claim_taken_between_the_rows_and_the_claim_is_left_to_its_taker(db, cfg, sched, monkeypatch):
    from orchestrator.ops import launchclaim
    from orchestrator.ops.launch import LaunchOutcome

    real = quicksubmit.mtbf_env_from

    def claimed_meanwhile(*a, **kw):  # runs between the two transactions
        with db.read() as s:
            attempt_id = get_job(s, "t").attempts[-1].id
        assert launchclaim.claim(db, attempt_id, reclaim=False) == 1
        return real(*a, **kw)

    monkeypatch.setattr(quicksubmit, "mtbf_env_from", claimed_meanwhile)
    out = _quick(cfg, "t")
    assert out.launched.outcome is LaunchOutcome.LOST_CLAIM and "t" not in sched.tokens


def test_a_claim_lost_during_the_backend_call_is_not_recorded_over_the_reclaimer(db, cfg, sched, monkeypatch):
    from orchestrator.ops.launch import LaunchOutcome

    def reclaimed() -> None:
        with db.write() as s:
            s.execute(update(Attempt).values(fence=Attempt.fence + 1))

    at_site(monkeypatch, "after_backend_submit", reclaimed)
    out = _quick(cfg, "r")
    assert out.launched.outcome is LaunchOutcome.LOST_CLAIM and "lost its launch claim" in out.launched.detail
    with db.read() as s:
        assert get_job(s, "r").attempts[-1].state is AttemptState.LAUNCHING  # left to the re-claimer


def test_a_refusal_while_preparing_fails_the_attempt_for_good(db, cfg, sched, tmp_path, monkeypatch):
    run_dir = cfg.runs_root / "s"
    run_dir.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    # planted after the checks before any row (they refuse it with nothing written), while the rows are made
    at_site(monkeypatch, "names_checked", lambda: (run_dir / "attempts").symlink_to(tmp_path / "elsewhere"))
    with pytest.raises(Refused, match="refused: s: "):
        _quick(cfg, "s")
    with db.read() as s:
        job = get_job(s, "s")
        assert job.state is JobState.FAILED and job.attempts[-1].failure_class.value == "invalid"
    assert list((tmp_path / "elsewhere").iterdir()) == [] and "s" not in sched.tokens


@pytest.mark.parametrize("permanent", [False, True])
def test_a_failed_backend_call_is_handled_as_launch_handles_it(db, cfg, sched, monkeypatch, permanent):
    def refuse(_spec):
        raise (SubmissionRefused if permanent else BackendError)("sbatch: error: the scheduler said no")

    monkeypatch.setattr(sched, "submit", refuse)
    with pytest.raises(Refused if permanent else OrchError, match="the scheduler said no"):
        _quick(cfg, "b")
    with db.read() as s:
        a = get_job(s, "b").attempts[-1]
    if permanent:
        assert a.state is AttemptState.FAILED and a.failure_class.value == "invalid"
    else:  # the claim stays: the reconciler looks the token up, then retries
        assert a.state is AttemptState.LAUNCHING and a.detail.startswith("submission failed (will be retried)")


def test_orch_submit_imports_no_sqlalchemy_and_says_what_it_submitted(tmp_path):
    """The whole point: a real `orch submit`, as a user runs it, after a first command made the DB."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "SLURM_"))}
    env.update(ORCH_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-m", "orchestrator.cli", "status"], env=env, check=True, capture_output=True)
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "orchestrator.cli", "submit", "--name", "q", "--",
                        "true"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("submitted q (local ") and f"run dir {tmp_path / 'home' / 'runs' / 'q'}" in p.stdout
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in p.stderr.splitlines() if ln.startswith("import time:")]
    assert "orchestrator.ops.quicksubmit" in imported
    assert not [m for m in imported if m.startswith(("sqlalchemy", "orchestrator.core.models", "alembic"))]


def test_a_submission_overtaken_by_a_cancel_is_stopped_before_the_slow_path_records_it(db, cfg, sched, monkeypatch):
    """Hostile test: the record of a launch that a cancel overtook waited for SQLAlchemy's import (~0.25 s)
    before its submission was stopped, and a short program ran to a verified end meanwhile. The quick path stops
    it itself, as launchrecord.record_in decides, and the slow record then only writes the DB."""
    from orchestrator.ops import launchrecord
    from orchestrator.ops.cancel import cancel

    at_site(monkeypatch, "fence_checked", lambda: cancel(db, cfg, ["o"]))
    recorded_after: list[list[list[str]]] = []
    real = launchrecord.record_own
    monkeypatch.setattr(launchrecord, "record_own", lambda *a, **kw: (recorded_after.append(list(sched.cancelled)),
                                                                 real(*a, **kw))[1])
    out = _quick(cfg, "o")
    assert recorded_after == [[["o"]]]  # stopped before the slow path was even entered
    assert sched.cancelled == [["o"]]  # once: the slow record does not stop it again
    with db.read() as s:
        a = get_job(s, "o").attempts[-1]
        assert a.state is AttemptState.STOPPING and a.external_id == out.launched.external_id
