"""``orch show NAME --events``: the job's history and every attempt's, each move one event (issue 18:
attempt moves wrote none, so an attempt had no history)."""

from __future__ import annotations

from localkit import RETRYABLE


def test_show_events_prints_the_job_and_attempt_history(orch):
    orch("submit", "--name", "h", "--", "/bin/sh", "-c", "exit 1", check=True)
    assert orch.wait("h", RETRYABLE, timeout=60) == "retryable_failed"
    d = orch.json("show", "h", "--events")
    events = [(e["attempt"], e["from"], e["to"]) for e in d["events"]]
    job = [(f, t) for a, f, t in events if a is None]
    attempt = [(f, t) for a, f, t in events if a == 1]
    assert job[0] == ("pending", "submitted") and job[-1][1] == "retryable_failed", events
    assert attempt[:2] == [("pending", "launching"), ("launching", "submitted")], events
    assert attempt[-1][1] == "failed", events
    assert all(e["at"].endswith("Z") and isinstance(e["reason"], str) for e in d["events"])
    assert "crash" in [e for e in d["events"] if e["attempt"] == 1][-1]["reason"]  # its end says why

    p = orch("show", "h", "--events", check=True)
    assert "Z  attempt 1: pending -> launching" in p.stdout, p.stdout
    assert "Z  job: pending -> submitted" in p.stdout, p.stdout
    assert "events" not in orch.show("h"), "the history is shown only when asked for"
