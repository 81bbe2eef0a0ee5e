"""8 concurrent orch processes (cron reconcilers and users' `requeue --failed`) over 200 failed jobs:
exactly one new attempt per job, no "database is locked", no tracebacks — on SQLite and on PostgreSQL.

The 200 retryable_failed jobs are made in-process with an instant fake backend (the only fake, at
the backend boundary); everything after that is the real CLI on the real local backend.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import orchkit
import pytest
from localkit import db_rows

from orchestrator import protocol
from orchestrator.backends.base import AttemptRef, Backend, Outcome, Phase, SubmitSpec
from orchestrator.core.config import load_config
from orchestrator.core.db import Database
from orchestrator.ops.reconcile import reconcile_pass
from orchestrator.ops.submit import SubmitRequest, submit

pytestmark = pytest.mark.each_db

N_JOBS = 100  # 8 processes race over each job; 200 took twice as long and proved the same (CI time)
# Attempt 1 was the fake's; every real run appends a line and succeeds, so a job that is launched
# twice shows two lines, and no job can fail again and be (legitimately) requeued a second time.
CMD = ["bash", "-c", 'echo "attempt=$ORCH_ATTEMPT" >> "$ORCH_RUN_DIR/ran.log"; mkdir -p result; '
                     "echo ok > result/out.txt"]


class InstantExit1(Backend):
    """Every attempt 'ran' and exited 1 at once."""

    name = "local"

    def submit(self, spec: SubmitSpec) -> str:
        return f"fake-{spec.token}"

    def poll(self, refs: Sequence[AttemptRef]) -> dict[str, Outcome]:
        return {r.token: Outcome(Phase.EXITED, exit_code=1) for r in refs}

    def cancel(self, refs: Sequence[AttemptRef]) -> None:
        pass

    def find_by_token(self, refs: Sequence[AttemptRef]) -> dict[str, str]:
        return {}


def _make_failed_jobs(home: Path, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_HOME", str(home))  # and ORCH_DB_URL as the orch fixture set it
    cfg = load_config()
    db = Database(cfg)
    fake = InstantExit1()
    orchkit.use_backend(monkeypatch, fake)
    for i in range(n):
        submit(db, cfg, SubmitRequest(name=f"job{i:03d}", command=CMD, max_attempts=5, outputs=["result/*"]))
    rep = reconcile_pass(db, cfg, backend_for=lambda _name: fake)
    assert rep.ran and len(rep.changed) == n
    db.engine.dispose()


def test_eight_concurrent_reconcilers_and_requeuers_make_exactly_one_new_attempt_per_job(orch, monkeypatch):
    _make_failed_jobs(orch.home, N_JOBS, monkeypatch)
    assert db_rows(orch.home, "SELECT state, count(*) FROM jobs GROUP BY state") == [("retryable_failed", N_JOBS)]
    assert db_rows(orch.home, "SELECT DISTINCT failure_class FROM attempts") == [("crash",)]

    argvs = [["requeue", "--failed"], ["reconcile"]] * 4
    procs = [subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *a], env=orch.env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for a in argvs]
    # Bounded by the timeout, never asserted on wall-clock time: the claim is exactly-once.
    outs = [(a, p, *p.communicate(timeout=120)) for a, p in zip(argvs, procs, strict=True)]

    for a, p, _out, err in outs:
        assert "locked" not in err and "Traceback" not in err and "unexpected error" not in err, (a, err)
        assert p.returncode == 0, (a, p.returncode, err)
    per_proc = [out.count(": requeued as attempt 2") for a, _p, out, _e in outs if a[0] == "requeue"]
    assert sum(1 for c in per_proc if c) >= 2, per_proc  # the requeuers really raced each other
    requeued = sum(per_proc)
    assert requeued == N_JOBS, f"{requeued} requeues reported"

    per_job = db_rows(orch.home, "SELECT j.name, count(a.id), max(a.n) FROM jobs j JOIN attempts a "
                                 "ON a.job_id = j.id GROUP BY j.id")
    assert len(per_job) == N_JOBS
    assert {(c, m) for _name, c, m in per_job} == {(2, 2)}

    # Let every attempt finish, then prove each ran once, in its own attempt dir.

    def all_verified() -> bool:
        if db_rows(orch.home, "SELECT count(*) FROM jobs WHERE state != 'done_marker_verified'") == [(0,)]:
            return True
        orch("reconcile", check=True)
        return False

    orchkit.wait_for(all_verified, 90, "every job verified", interval=0.3,
                     detail=lambda: db_rows(orch.home, "SELECT state, count(*) FROM jobs GROUP BY state"))
    for i in range(N_JOBS):
        run = orch.runs / f"job{i:03d}"
        assert (run / "ran.log").read_text() == "attempt=2\n", run
        assert not list(protocol.attempt_dir(run, 2).glob("exit.prev-*"))
        assert protocol.verify_done_marker(run).verified
