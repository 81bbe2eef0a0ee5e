"""``orch show NAME --events``: the job's history and every attempt's, each move one event (before,
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


def test_show_events_of_a_sweep_prints_every_tasks_history(orch):
    """A sweep's name shows its tasks; with ``--events`` also each task's moves, naming the task (a hostile
    pass found ``orch show SWEEP --events`` printed no event at all)."""
    orch("sweep", "--name", "sw", "--grid", "i=1,2", "--outputs", "out.txt", "--", "/bin/sh", "-c", "echo ok > out.txt",
         check=True)
    for task in ("sw.0000", "sw.0001"):
        orch.wait(task, {"done_marker_verified"}, timeout=60)
    d = orch.json("show", "sw", "--events")
    by_task = {t: [(e["attempt"], e["from"], e["to"]) for e in d["events"] if e["task"] == t]
               for t in ("sw.0000", "sw.0001")}
    for task, events in by_task.items():
        assert (None, "pending", "submitted") in events and events[-1][2] == "done_marker_verified", (task, events)
        assert (1, "pending", "launching") in events, (task, events)
    p = orch("show", "sw", "--events", check=True)
    assert "Z  sw.0001 attempt 1: pending -> launching" in p.stdout, p.stdout
    assert "events" not in orch.json("show", "sw"), "the history is shown only when asked for"
