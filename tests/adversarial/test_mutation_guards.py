"""Mutation discipline: guards today's suite did not catch when removed, each with a test that fails
without it. (The marker's fsyncs: tests/unit/test_protocol.py, the recording shim.)"""

from __future__ import annotations

import os
from pathlib import Path

from advkit import assert_no_stuck, orch_popen, show

from orchestrator import protocol


def test_a_launch_never_runs_the_program_of_a_job_whose_marker_verified_after_its_requeue(orch, tmp_path):
    """The launch-time check in launch._ready: the requeue verified the marker (not done yet) and created
    attempt 2; the launcher died after its claim; meanwhile the job's result appeared, verified (attempt 1's
    program finished after all). The launch that takes the expired claim over must close the job as done and
    never run the program again (it would redo the work, or clear a verified result)."""
    side = tmp_path / "ran.log"
    prog = f"echo \"$ORCH_ATTEMPT\" >> {side}; exit 1"
    p = orch("submit", "--name", "late", "--outputs", "out.txt", "--", "sh", "-c", prog)
    assert p.returncode == 0, p.stderr
    assert orch.wait("late", {"retryable_failed"}, timeout=60) == "retryable_failed"
    assert side.read_text() == "1\n"
    # The launcher of attempt 2 dies right after it prepared the run dir (its claim stays, unlaunched).
    rq = orch_popen(orch, "requeue", "late", env={"ORCH_FAULT": "after_attempt_row"})
    rq.communicate(timeout=60)
    assert rq.returncode == 99, "the requeue's launcher should have died at after_attempt_row"
    d = show(orch, "late")
    assert [a["state"] for a in d["attempts"]] == ["failed", "launching"], d["attempts"]
    run = Path(d["run_dir"])
    (run / "out.txt").write_text("the result, written late by attempt 1\n")
    protocol.write_done_marker(run, "late", 1, ["out.txt"])
    before = (run / protocol.DONE_MARKER).read_bytes()

    p = orch("reconcile", env={"ORCH_LAUNCH_GRACE_S": "0"})  # the claim expired: the pass takes it over
    assert p.returncode == 0, p.stderr
    d = show(orch, "late")
    assert d["state"] == "done_marker_verified", d
    assert d["attempts"][1]["state"] == "cancelled" and "marker verifies" in d["attempts"][1]["detail"], d["attempts"]
    assert side.read_text() == "1\n", "the program ran again for a job whose marker verified"
    assert (run / protocol.DONE_MARKER).read_bytes() == before and (run / "out.txt").exists()
    assert protocol.verify_done_marker(run).verified
    assert not os.environ.get("ORCH_FAULT")
    assert_no_stuck(orch)
