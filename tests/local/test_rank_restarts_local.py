"""Ranks restarted inside the allocation (``--rank-restarts``), on the local backend with real torchrun and gloo.

A rank SIGKILLed mid-run (what an ECC error or a kill -9 does) no longer ends the attempt: the wrapper launches the
ranks again in the same attempt, they resume from the newest commit, and the job ends verified with one attempt,
the restart recorded (``orch show``), and no step computed twice but those after that commit. A cancel after a
restart stops the relaunched ranks, not the dead launch's.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter

from orchkit import wait_for
from rankkit import GLOO_ENV, rank_envs, rank_program, steps_done, token_carriers

from orchestrator import protocol

DONE = "done_marker_verified"
STEPS = 80  # the rank program commits every 20 steps


def _submit(orch, tmp_path, name: str, *extra: str) -> tuple:
    logs = tmp_path / "logs"
    logs.mkdir()
    prog = rank_program(tmp_path)
    orch("submit", "--name", name, "--nproc-per-node", "2", *extra, "--", sys.executable, str(prog),
         "--max-steps", str(STEPS), "--sleep", "0.05", "--log-dir", str(logs), env=GLOO_ENV, check=True)
    envs = wait_for(lambda: len(e := rank_envs(logs, 1)) == 2 and e, 60, "both ranks' environments")
    return logs, envs


def _kill_rank_after(logs, envs, rank: int, step: int) -> None:
    wait_for(lambda: any(s >= step for _a, s in steps_done(logs, rank)), 90, f"rank {rank} at step {step}",
             detail=lambda: steps_done(logs, rank)[-3:])
    os.kill(envs[rank]["pid"], signal.SIGKILL)


def test_a_killed_rank_is_restarted_in_the_allocation_from_the_last_commit_and_the_attempt_verifies(orch, tmp_path):
    logs, envs = _submit(orch, tmp_path, "rr", "--rank-restarts", "2")
    _kill_rank_after(logs, envs, 1, 45)  # after the commit at step 40
    assert orch.wait("rr", {DONE, "failed", "cancelled"}, timeout=180) == DONE, orch.show("rr")
    show = orch.show("rr")
    (a,) = show["attempts"]  # no second attempt: the retry never left the allocation
    assert (a["state"], a["restarts"]) == ("succeeded", 0), a
    (r,) = a["rank_restarts"]
    assert (r["class"], r["failed_rank"], r["rank_returncode"]) == ("killed", 1, -signal.SIGKILL), r
    assert r["resume_step"] is not None and r["resume_step"] >= 40 and r["failed_step"] >= r["resume_step"], r
    for rank in (0, 1):
        done = Counter(s for _a, s in steps_done(logs, rank))
        assert set(done) == set(range(1, STEPS + 1)), (rank, sorted(done))
        again = sorted(s for s, n in done.items() if n > 1)
        # only what came after the newest commit was computed twice (at most up to where the rank died)
        assert all(r["resume_step"] < s <= r["failed_step"] + 1 for s in again), (rank, again, r)
    adir = protocol.attempt_dir(orch.runs / "rr", 1)
    assert (adir / "rank-restarts" / "1" / "failure.json").exists()  # the failed launch's report, kept aside
    assert "rank restart 1/2 in the allocation (killed, rank 1 ended -9)" in (adir / "stderr.log").read_text()
    text = orch("show", "rr", check=True).stdout
    assert "rank restarts in the allocation: 1 (killed: rank 1 ended -9 at step" in text, text
    metrics = orch("metrics", check=True).stdout  # counted by the passes that watched it (migration 0012)
    assert 'orch_rank_restarts{class="killed"} 1\n' in metrics, metrics
    assert "orch_rank_restart_steps_redone_count 1\n" in metrics, metrics


def test_a_cancel_after_a_rank_restart_stops_the_relaunched_ranks(orch, tmp_path):
    logs, envs = _submit(orch, tmp_path, "rc", "--rank-restarts", "2")
    token = orch.show("rc")["attempts"][0]["token"]
    old = envs[0]["pid"]
    _kill_rank_after(logs, envs, 0, 5)
    # the relaunch rewrote each rank's env record with its new pid
    wait_for(lambda: len(e := rank_envs(logs, 1)) == 2 and old not in {x["pid"] for x in e.values()}, 90,
             "the relaunched ranks", detail=lambda: rank_envs(logs, 1))
    assert orch("cancel", "rc").returncode == 0
    a = wait_for(lambda: (x := orch("reconcile") and orch.show("rc")["attempts"][0])["state"]
                 not in ("running", "submitted", "stopping") and x, 120, "the attempt to end")
    assert (a["state"], a["failure_class"], len(a["rank_restarts"])) == ("cancelled", "cancelled", 1), a
    left = token_carriers(token)
    assert not left, [(q.pid, q.cmdline()) for q in left]
