"""Cancel sends SIGTERM (the job may checkpoint); a requeue waits until that attempt has really exited."""

from __future__ import annotations

import time


def test_requeue_refuses_while_the_cancelled_attempt_is_still_stopping(orch):
    # The job takes 3 s to stop after SIGTERM (a checkpoint being written): a new attempt started
    # meanwhile would run beside it in the same run dir.
    orch("submit", "--name", "slow-stop", "--", "bash", "-c",
         'trap "sleep 3; exit 143" TERM; sleep 60 & wait', check=True)
    orch.wait("slow-stop", {"running"}, timeout=30)
    p = orch("cancel", "slow-stop")
    assert (p.returncode, p.stdout.strip()) == (0, "slow-stop: cancelled")
    p = orch("requeue", "slow-stop")
    assert p.returncode == 3, p.stdout + p.stderr
    assert "still stopping" in p.stderr
    assert len(orch.show("slow-stop")["attempts"]) == 1
    time.sleep(4.5)
    p = orch("requeue", "slow-stop", check=True)
    assert "requeued as attempt 2" in p.stdout
    orch("cancel", "slow-stop", check=True)


def test_cancel_of_a_finished_job_is_refused(orch):
    orch("submit", "--name", "fin", "--outputs", "o.txt", "--", "bash", "-c", "echo x > o.txt", check=True)
    orch.wait("fin", {"done_marker_verified"}, timeout=30)
    p = orch("cancel", "fin")
    assert p.returncode == 3 and "not cancelled: job is done_marker_verified" in p.stdout
    assert orch.state("fin") == "done_marker_verified"
