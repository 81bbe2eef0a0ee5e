"""Every attempt runs with the environment the job was submitted from, whoever launches it."""

from __future__ import annotations

from localkit import db_rows


def test_a_retry_launched_by_a_bare_reconciler_gets_the_submitters_environment(orch):
    # Attempt 1 records $FOO and fails; attempt 2 is launched by `orch requeue` from a process
    # without FOO (as a cron reconciler would be): it must still see FOO.
    prog = 'echo "$ORCH_ATTEMPT:${FOO-unset}" >> seen.log; [ "$ORCH_ATTEMPT" = 1 ] && exit 1; echo ok > out.txt'
    p = orch("submit", "--name", "env", "--outputs", "out.txt", "--", "sh", "-c", prog, env={"FOO": "from-shell"})
    assert p.returncode == 0, p.stderr
    assert orch.wait("env", {"retryable_failed"}, timeout=60) == "retryable_failed"
    assert "FOO" not in orch.env
    assert orch("requeue", "env").returncode == 0
    assert orch.wait("env", {"done_marker_verified"}, timeout=60) == "done_marker_verified"
    assert (orch.runs / "env" / "seen.log").read_text().split() == ["1:from-shell", "2:from-shell"]


def test_jobs_submitted_from_one_shell_share_one_stored_environment(orch):
    for name in ("a", "b"):
        assert orch("submit", "--name", name, "--", "true").returncode == 0
    assert orch("submit", "--name", "c", "--", "true", env={"OTHER": "1"}).returncode == 0
    assert db_rows(orch.home, "SELECT count(*) FROM environments") == [(2,)]
    assert db_rows(orch.home, "SELECT count(DISTINCT env_id) FROM jobs WHERE name IN ('a', 'b')") == [(1,)]


# Attempt 1 commits a checkpoint of step 5 in orch's layout (as the kit does), then dies of SIGKILL; attempt 2 only
# records what it was told. An ORCH_RESUME_STEP in the submitting shell is never passed on.
RESUME = """
import os, pathlib, signal, sys
with open("seen.log", "a") as f:
    f.write(os.environ["ORCH_ATTEMPT"] + ":" + os.environ.get("ORCH_RESUME_STEP", "unset") + "\\n")
if os.environ["ORCH_ATTEMPT"] == "1":
    from orchestrator.kit.commit import commit_checkpoint
    commit_checkpoint(pathlib.Path("."), 5, write=lambda d: (d / "w.bin").write_bytes(b"w"))
    os.kill(os.getpid(), signal.SIGKILL)
pathlib.Path("out.txt").write_text("ok")
"""


def test_every_attempt_is_told_the_step_it_resumes_from(orch):
    """``ORCH_RESUME_STEP`` (0 on a first attempt; the newest committed checkpoint's step after it): what a
    tracker of the program shows from the next step on is this attempt's (TensorBoard's purge_step)."""
    import sys

    orch.write_config("[policy]\ncrash_backoff_s = 1\n")
    p = orch("submit", "--name", "rs", "--outputs", "out.txt", "--", sys.executable, "-c", RESUME,
             env={"ORCH_RESUME_STEP": "99"})
    assert p.returncode == 0, p.stderr
    assert orch.wait("rs", {"done_marker_verified", "failed"}, timeout=120) == "done_marker_verified", orch.show("rs")
    assert (orch.runs / "rs" / "seen.log").read_text().split() == ["1:0", "2:5"]
