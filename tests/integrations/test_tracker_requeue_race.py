"""A requeue right after `orch cancel`, while the child that marks the cancelled job's MLflow run is still at work: the
new attempt's run must end up RUNNING with no end noted, whichever of the two comes first. A real MLflow store
(SQLite); the child is held at a named point (ORCH_PAUSE_AT) until the new attempt is where the case needs it.

- ``trackerfinish_start``: the child has not taken the run dir's tracker lock when attempt 2 arranges its run; let go
  afterwards, it must see attempt 2 and mark nothing (it marked the new run KILLED before trackerlock.py).
- ``trackerfinish_marking``: the child holds the lock, about to mark KILLED, when attempt 2's wrapper starts; the
  wrapper must arrange the run only after the mark (it set RUNNING first and was then overwritten).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from orchkit import wait_for

from orchestrator import protocol

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

SLEEPER = """
import os, time, mlflow
mlflow.start_run()
mlflow.log_metric("attempt", float(os.environ["ORCH_ATTEMPT"]), step=int(os.environ["ORCH_ATTEMPT"]))
time.sleep(600)
"""


def _openers(path: Path) -> set[int]:
    """The processes that have ``path`` open (a waiter for a lock file orch polls holds it open)."""
    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == str(path):
                    pids.add(int(proc.name))
            except OSError:
                continue
    return pids


def _marker_children(pause_file: Path) -> list[int]:
    """The tracker-mark children this test started: their command line, and its pause file in their environment."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
            env = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"orchestrator.jobside.trackerfinish" in cmd and f"ORCH_PAUSE_UNTIL={pause_file}".encode() in env:
            pids.append(int(proc.name))
    return pids


@pytest.mark.parametrize("site", ["trackerfinish_start", "trackerfinish_marking"])
def test_a_requeue_right_after_cancel_keeps_the_new_attempts_run_running(orch, tmp_path, site):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    client.search_runs(["0"])  # the store's tables exist before the wrapper creates the run
    orch("submit", "--name", "r", "--", sys.executable, "-c", SLEEPER, env={"MLFLOW_TRACKING_URI": uri}, check=True)
    run_dir = orch.runs / "r"

    def logged(attempt: int) -> bool:
        runs = client.search_runs(["0"])
        return bool(runs) and runs[0].data.metrics.get("attempt") == float(attempt) or (orch("reconcile") and False)

    wait_for(lambda: logged(1), 120, "attempt 1's run logged")
    run_id = client.search_runs(["0"])[0].info.run_id

    # Cancel; whichever command commits the cancelled end starts the mark child, which stops at `site`.
    pause = tmp_path / "let-go"
    orch.env.update(ORCH_PAUSE_AT=site, ORCH_PAUSE_UNTIL=str(pause), ORCH_PAUSE_S="300")
    orch("cancel", "r", check=True)
    assert orch.wait("r", {"cancelled"}, timeout=120) == "cancelled"
    wait_for(lambda: Path(f"{pause}.reached").exists(), 60, f"the mark child at {site}")
    for k in ("ORCH_PAUSE_AT", "ORCH_PAUSE_UNTIL", "ORCH_PAUSE_S"):
        del orch.env[k]
    children = _marker_children(pause)
    assert len(children) == 1, children

    orch("requeue", "r", check=True)
    if site == "trackerfinish_start":
        # Attempt 2 arranged its run and its program logged: then the child, let go, must leave the run alone.
        wait_for(lambda: logged(2), 120, "attempt 2's run logged")
    else:
        # Attempt 2's wrapper is up and waits for the lock the child holds (it has the lock file open too), before it
        # arranges the run: nothing of attempt 2 has been arranged yet.
        lock = orch.runs / protocol.LOCKS_DIR / "r.trackers.lock"
        wait_for(lambda: _openers(lock) - set(children) or (orch("reconcile") and False), 120,
                 "attempt 2's wrapper waiting for the tracker lock")
        assert client.get_run(run_id).data.tags["orch.attempt"] == "1"
    pause.touch()
    wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in children), 90, "the mark child to end")
    wait_for(lambda: logged(2), 120, "attempt 2's run logged")

    run = client.get_run(run_id)
    assert run.info.status == "RUNNING" and run.data.tags["orch.attempt"] == "2", run.info
    assert "end" not in protocol.read_trackers(run_dir)["mlflow"], protocol.read_trackers(run_dir)
    assert orch.state("r") == "running"
    # The killed attempt 1 never ended its run: an end time is the child's mark. Let go before attempt 2 existed
    # it marks; let go after, it must not.
    assert (run.info.end_time is not None) == (site == "trackerfinish_marking"), run.info
    orch("cancel", "r", check=True)
    assert orch.wait("r", {"cancelled"}, timeout=120) == "cancelled"
    wait_for(lambda: client.get_run(run_id).info.status == "KILLED", 60, "the run KILLED at the job's end")
    assert os.path.exists(orch.runs / protocol.LOCKS_DIR / "r.trackers.lock")
