"""`orch logs` prints an attempt's output; `-f` follows it until the attempt ends, changing nothing."""

from __future__ import annotations


def test_logs_follow_prints_everything_and_changes_no_state(orch):
    orch("submit", "--name", "talk", "--", "bash", "-c", "for i in 1 2 3; do echo line $i; sleep 0.5; done; "
         "echo oops >&2", check=True)
    p = orch("logs", "talk", "-f", timeout=30)
    assert p.returncode == 0
    assert [ln for ln in p.stdout.splitlines() if ln.startswith("line")] == ["line 1", "line 2", "line 3"]
    assert orch.state("talk") == "submitted", "a read command must not reconcile"
    p = orch("logs", "talk", "--attempt", "1", check=True)
    assert "oops" in p.stdout and "stderr.log" in p.stdout


def test_logs_of_an_attempt_that_does_not_exist_is_a_usage_error(orch):
    orch("submit", "--name", "one", "--", "true", check=True)
    p = orch("logs", "one", "--attempt", "7")
    assert p.returncode == 2 and "has no attempt 7" in p.stderr
