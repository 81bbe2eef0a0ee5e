"""When orch decides a job's end (verified, failed, cancelled), its tracker run is marked so.

Why here: the program cannot say it. A killed attempt's MLflow run stayed RUNNING for good (MLflow issue #10510), and
a job that orch gives up on, or that a user cancels, ends without its program's knowledge. Every terminal move of a
job goes through ``lifecycle`` in a transaction; this module notes the ones whose run dir records a tracker run
(``trackers.json``: MLflow's, mlflowrun.py; W&B's, kit/wandbrecord.py), and once the transaction committed (never
for one rolled back) hands them to ONE detached child (``python -m orchestrator.jobside.trackerfinish finish-many``).
The committing command never waits on a tracking server: a reconcile pass or ``orch cancel`` costs a stat per
ended job and, at most, one process start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.orm import Session

from orchestrator import protocol
from orchestrator.core.states import JobState

END_OF = {JobState.DONE: "verified", JobState.FAILED: "failed", JobState.CANCELLED: "cancelled"}
_KEY = "orch_tracker_ends"


def note(s: Session, run_dir: str | None, dst: JobState) -> None:
    """Called by ``lifecycle`` for each job move in ``s``: remember a terminal one whose run dir has a tracker run,
    with its newest attempt now (a mark made after a newer attempt exists is skipped: trackerlock.py)."""
    end = END_OF.get(dst)
    if end is None or not run_dir:
        return
    try:
        if not (Path(run_dir) / protocol.TRACKERS_FILE).is_file():
            return
    except OSError:
        return
    s.info.setdefault(_KEY, []).append((run_dir, end, protocol.newest_attempt(run_dir)))


@event.listens_for(Session, "after_commit")
def _after_commit(s: Session) -> None:
    ends = s.info.pop(_KEY, None)
    if ends:
        spawn(ends)


@event.listens_for(Session, "after_rollback")
def _after_rollback(s: Session) -> None:
    s.info.pop(_KEY, None)


def spawn(ends: list[tuple[str, str, int | None]]) -> subprocess.Popen[bytes] | None:
    """One detached child marks every run (bounded by its own alarm); its output goes to nobody's terminal."""
    try:
        p = subprocess.Popen([sys.executable, "-m", "orchestrator.jobside.trackerfinish", "finish-many"],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True,
                             env={**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"})
        assert p.stdin is not None
        p.stdin.write(json.dumps(ends).encode())
        p.stdin.close()
        threading.Thread(target=p.wait, daemon=True).start()  # reaped, in a long-lived process too
        return p
    except (OSError, ValueError) as e:  # the job's end stands; only its tracker run keeps the last status
        print(f"orch: cannot mark the tracker runs of {len(ends)} ended job(s): {e}", file=sys.stderr)
        return None
