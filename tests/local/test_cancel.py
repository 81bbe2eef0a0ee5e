"""Cancel sends SIGTERM (the job may checkpoint); a requeue waits until that attempt has really exited."""

from __future__ import annotations

import os

import psutil
from localkit import wrapper_record
from orchkit import wait_for


def _sid(p: psutil.Process) -> int | None:
    """The session of a live process (a zombie has finished: it runs nothing)."""
    try:
        return None if p.status() == psutil.STATUS_ZOMBIE else os.getsid(p.pid)
    except (OSError, psutil.Error):
        return None


def test_requeue_refuses_while_the_cancelled_attempt_is_still_stopping(orch):
    # The job stops after SIGTERM only once the test lets it (a checkpoint being written, for as long as the
    # machine makes it take): a new attempt started meanwhile would run beside it in the same run dir. A fixed
    # 3 s stop was outlasted by cancel + requeue on a loaded CI machine, and the requeue rightly went through.
    orch("submit", "--name", "slow-stop", "--", "bash", "-c",
         'trap "while [ ! -e stop-now ]; do sleep 0.05; done; exit 143" TERM; sleep 60 & wait', check=True)
    orch.wait("slow-stop", {"running"}, timeout=30)
    p = orch("cancel", "slow-stop")
    assert (p.returncode, p.stdout.strip()) == (0, "slow-stop: cancelled")
    for _ in range(2):  # still stopping however often it is asked
        p = orch("requeue", "slow-stop")
        assert p.returncode == 3, p.stdout + p.stderr
        assert "still stopping" in p.stderr
    assert len(orch.show("slow-stop")["attempts"]) == 1
    (orch.runs / "slow-stop" / "stop-now").touch()
    # Every requeue before the trap has finished is the same refusal; the first one after it succeeds.

    def requeued() -> object:
        p = orch("requeue", "slow-stop")
        assert p.returncode != 3 or "still stopping" in p.stderr, p.stderr
        return p if p.returncode != 3 else None

    p = wait_for(requeued, 60, "the cancelled attempt to finish stopping (requeue accepted)", interval=0.2)
    assert p.returncode == 0 and "requeued as attempt 2" in p.stdout, p.stdout + p.stderr
    # Attempt 1's whole session (the wrapper's pid is its session id) was gone before attempt 2 began.
    sid = wrapper_record(orch.runs / "slow-stop", 1)["pid"]
    assert not [p for p in psutil.process_iter() if _sid(p) == sid], "requeued while attempt 1 still ran"
    orch("cancel", "slow-stop", check=True)


def test_cancel_of_a_finished_job_is_refused(orch):
    orch("submit", "--name", "fin", "--outputs", "o.txt", "--", "bash", "-c", "echo x > o.txt", check=True)
    orch.wait("fin", {"done_marker_verified"}, timeout=30)
    p = orch("cancel", "fin")
    assert p.returncode == 3 and "not cancelled: job is done_marker_verified" in p.stdout
    assert orch.state("fin") == "done_marker_verified"
