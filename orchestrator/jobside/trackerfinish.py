"""Mark each tracker run of the jobs that ended with the end orch decided (the detached child of trackerend.py).

``python -m orchestrator.jobside.trackerfinish finish-many`` reads ``[[run_dir, end, attempt], ...]`` on stdin (end:
verified, failed or cancelled; attempt: the newest when the end was decided) and, per run dir, holding its tracker
lock, marks what ``trackers.json`` records, unless a newer attempt was made since (trackerlock.py):

- MLflow: the run's status FINISHED / FAILED / KILLED (mlflowrun.py);
- W&B, for a failed or cancelled end only: the run is resumed once and finished with exit code 1 (failed) or 143
  (cancelled), its summary's ``orch/end`` naming the end. W&B's state is what the last process reported, and a
  preempted attempt's process reports a clean end: a job cancelled between attempts showed "finished". A verified
  job's last process already finished the run with exit code 0; resuming it would only risk that state.

Each mark costs only its own run: a failure is one line on stderr, and the next run is still marked. The child
bounds itself (nobody waits on it): a W&B resume takes about a second, and none starts with under
``WANDB_MIN_LEFT_S`` of its time left.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from pathlib import Path

from orchestrator import protocol, testhooks
from orchestrator.jobside import mlflowrun, trackerlock

TIMEOUT_S = mlflowrun.TIMEOUT_S
WANDB_MIN_LEFT_S = 20.0
WANDB_EXIT_CODE = {"failed": 1, "cancelled": 143}  # W&B: exit code 0 is "finished", any other "failed"


def finish_wandb(run_dir: Path, end: str, deadline: float = math.inf) -> str | None:
    """Resume the recorded W&B run and finish it with ``end``'s exit code; None when there is nothing to mark.
    ``deadline`` (monotonic): none starts with under ``WANDB_MIN_LEFT_S`` left before it."""
    rec = protocol.wandb_record(run_dir)
    if rec is None or end not in WANDB_EXIT_CODE:
        return None
    if deadline - time.monotonic() < WANDB_MIN_LEFT_S:
        raise TimeoutError(f"W&B run not marked {end}: no time left in this pass")
    import wandb

    # The program's W&B dir when it lies in the run dir (an offline mark is synced with the attempts' files),
    # else the run dir: orch writes nothing outside its own.
    root = Path(rec["root_dir"])
    here = root if root.resolve().is_relative_to(Path(run_dir).resolve()) else Path(run_dir)
    if (here / "wandb").is_symlink():  # the job's own link would take W&B's writes wherever it points
        raise OSError(f"{here / 'wandb'} is a symlink: orch writes nothing through it")
    settings = wandb.Settings(console="off", silent=True, x_disable_stats=True, x_disable_meta=True)
    run = wandb.init(id=rec["run_id"], project=rec["project"] or None, entity=rec["entity"] or None, dir=str(here),
                     mode=rec["mode"], resume="allow", settings=settings)
    try:
        run.summary["orch/end"] = end
    finally:
        run.finish(exit_code=WANDB_EXIT_CODE[end])
    protocol.write_tracker(run_dir, "wandb", {**rec, "end": end, "end_dir": str(here)})
    return f"W&B run {rec['run_id']}: {end} (exit code {WANDB_EXIT_CODE[end]})"


def finish_many(raw: str) -> int:
    """Mark every run of ``[[run_dir, end, attempt], ...]``; exit 1 when any mark failed."""
    deadline = time.monotonic() + TIMEOUT_S
    failed = 0
    for run_dir, end, *newest in json.loads(raw):
        attempt = newest[0] if newest else None  # [run_dir, end]: an older orch's request, marked as before
        testhooks.site("trackerfinish_start")
        if not (Path(run_dir) / protocol.TRACKERS_FILE).is_file():
            continue  # nothing recorded to mark (a run dir moved or deleted since): no lock file made there
        try:
            with trackerlock.held(run_dir, max(0.0, deadline - time.monotonic())):
                if trackerlock.superseded(run_dir, attempt):
                    print(f"{run_dir}: not marked {end}: attempt {protocol.newest_attempt(run_dir)} was made since")
                    continue
                testhooks.site("trackerfinish_marking")
                failed += _mark(Path(run_dir), end, deadline)
        except trackerlock.TrackerLockError as e:
            failed += 1
            print(f"{run_dir}: not marked {end}: {e}", file=sys.stderr)
    return 1 if failed else 0


def _mark(run_dir: Path, end: str, deadline: float) -> int:
    """Mark the run dir's MLflow and W&B runs; the number of marks that failed (each one line on stderr)."""
    failed = 0
    for tracker, mark in (("mlflow", mlflowrun.finish_here), ("wandb", lambda d, e: finish_wandb(d, e, deadline))):
        try:
            said = mark(run_dir, end)
        except ImportError as e:
            failed += 1
            print(f"{run_dir}: {e.name} is not importable by orch's Python ({sys.executable})", file=sys.stderr)
            continue
        except Exception as e:  # one line per run, whatever the tracker raised
            failed += 1
            print(f"{run_dir}: {tracker}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        if said:
            print(said)
    return failed


def main(argv: list[str]) -> int:
    if argv == ["finish-many"]:
        signal.alarm(int(TIMEOUT_S))  # detached: nobody waits on it, so it bounds itself
        return finish_many(sys.stdin.read())
    print("usage: python -m orchestrator.jobside.trackerfinish finish-many  ([[run_dir, end, attempt], ...] on stdin)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
