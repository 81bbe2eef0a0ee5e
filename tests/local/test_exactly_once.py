"""Exactly-once submission: `orch submit` killed around the backend call; reconcile resolves it.

testhooks.site(site) with ORCH_FAULT=site makes the process die with exit 99 at the named site, as a kill -9 would:
``after_attempt_row`` (the attempt row and command.json exist, the backend was never called) and
``after_backend_submit`` (the job is running, the DB does not know its id). On SQLite; on PostgreSQL
for one site (to save CI time: PostgreSQL variants only where the DB matters -- here, what a commit made
visible before the crash; the recovery logic after it is the same code on either DB).
"""

from __future__ import annotations

import psutil
import pytest
from localkit import DONE, ONCE, assert_ran_once, db_rows, reconcile_until_verified
from orchkit import wait_for

from orchestrator import protocol


def _wrappers_of(token: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "orchestrator.jobside.wrapper" in cmd and token in cmd:
            out.append(p)
    return out


@pytest.mark.parametrize("db_kind, site", [("sqlite", "after_attempt_row"), ("sqlite", "after_backend_submit"),
                                           ("postgres", "after_attempt_row")],
                         ids=["sqlite-after_attempt_row", "sqlite-after_backend_submit", "postgres-after_attempt_row"],
                         indirect=["db_kind"])
def test_submit_killed_at_a_fault_site_runs_the_job_exactly_once_after_reconcile(orch, site):
    p = orch("submit", "--name", "once", "--outputs", "result/*", "--", "bash", "-c", ONCE,
             env={"ORCH_FAULT": site})
    assert p.returncode == 99, (p.stdout, p.stderr)
    run = orch.runs / "once"
    ((job_state,),) = db_rows(orch.home, "SELECT state FROM jobs WHERE name = 'once'")
    rows = db_rows(orch.home, "SELECT n, state, token, external_id FROM attempts")
    assert job_state == "pending" and len(rows) == 1
    n, a_state, token, external_id = rows[0]
    # Claimed by the dead launcher: the crash hid whether the backend ran it.
    assert (n, a_state, external_id) == (1, "launching", None)
    assert (protocol.attempt_dir(run, 1) / "command.json").exists()

    # Within the launch grace (default 60 s) a pass leaves the in-doubt attempt alone.
    orch("reconcile", check=True)
    assert db_rows(orch.home, "SELECT state FROM attempts") == [("launching",)]

    fast = {"ORCH_LAUNCH_GRACE_S": "0"}
    r = orch("reconcile", env=fast)
    assert r.returncode == 0, r.stderr
    why = "found by token" if site == "after_backend_submit" else "submission was lost"
    assert f"once: -> submitted why={why}" in r.stdout
    assert len(_wrappers_of(token)) <= 1
    for _ in range(3):  # more passes, still one run
        orch("reconcile", env=fast, check=True)
        assert len(_wrappers_of(token)) <= 1

    reconcile_until_verified(orch, "once")
    assert_ran_once(orch, "once")
    assert not list(protocol.attempt_dir(run, 1).glob("exit.prev-*"))  # no second wrapper in this attempt
    assert orch.state("once") in DONE


def test_stale_exit_record_of_an_earlier_run_is_not_taken_for_this_attempts_submission(orch):
    # A run dir reused under a fresh DB (seed 000's situation) still holds attempts/1/ of the
    # earlier run. Its exit record carries another token: it must not make the in-doubt attempt 1
    # look submitted, or the job would never run at all.
    run = orch.runs / "reused"
    old = protocol.attempt_dir(run, 1)
    old.mkdir(parents=True)
    protocol.atomic_write_json(old / "exit.json", {"returncode": 1, "signal": None, "token": "0badc0ffee0badc0",
                                                  "ended_at": protocol.now_iso()})
    p = orch("submit", "--name", "reused", "--outputs", "result/*", "--", "bash", "-c", ONCE,
             env={"ORCH_FAULT": "after_attempt_row"})
    assert p.returncode == 99
    fast = {"ORCH_LAUNCH_GRACE_S": "0"}
    r = orch("reconcile", env=fast)
    assert "reused: -> submitted why=submission was lost" in r.stdout, r.stdout

    def ended() -> bool:
        if orch.state("reused") in ("done_marker_verified", "retryable_failed", "failed"):
            return True
        orch("reconcile", env=fast, check=True)
        return False

    wait_for(ended, 60, "reused to end", interval=0.2, detail=lambda: orch.show("reused"))
    assert orch.state("reused") == "done_marker_verified", orch.show("reused")
    assert (run / "ran.log").read_text().count("attempt=1") == 1


def test_local_find_by_token_trusts_only_this_attempts_own_exit_record(tmp_path):
    from orchestrator.backends.base import AttemptRef
    from orchestrator.backends.local import LocalBackend

    ref = AttemptRef(None, "feedfacefeedface", tmp_path, 1)
    adir = protocol.attempt_dir(tmp_path, 1)
    adir.mkdir(parents=True)
    protocol.atomic_write_json(adir / "exit.json", {"returncode": 1, "token": "0badc0ffee0badc0"})
    assert LocalBackend().find_by_token([ref]) == {}  # an earlier run's record: not a submission
    # The wrapper could not start the command: exit.json (this token) without wrapper.json.
    protocol.atomic_write_json(adir / "exit.json", {"returncode": 127, "token": ref.token})
    assert LocalBackend().find_by_token([ref]) == {ref.token: "ended"}
