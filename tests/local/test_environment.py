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
