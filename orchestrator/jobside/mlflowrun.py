"""One MLflow run per job: every attempt of a script that calls plain ``mlflow.start_run()`` continues it.

Why orch arranges it: ``mlflow.start_run()`` opens a new run in each process, so a job preempted twice showed three
runs, and a killed attempt's run stayed RUNNING for good. MLflow continues a run named by ``MLFLOW_RUN_ID``, but only
one that exists. So, before the program starts, the job wrapper runs this module (in a child process: a tracking
server that hangs costs the attempt at most ``TIMEOUT_S``, never the wrapper's memory): it creates the job's run once,
records it in the run dir's ``trackers.json``, and on every later attempt finds it there; the wrapper passes its id
as ``MLFLOW_RUN_ID``. The run's tags name the orch job, its run dir, the attempt and the sweep task.

Only when the program's environment sets ``MLFLOW_TRACKING_URI`` and no ``MLFLOW_RUN_ID`` of the user's own, and
``mlflow`` (or ``mlflow-skinny``) is importable by orch's Python. Otherwise, or on any failure, the attempt runs as
before and its log says why. ``finish_here`` (trackerfinish.py) marks the run's end as orch decided it: FINISHED,
FAILED, KILLED.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from orchestrator import protocol

TIMEOUT_S = 60.0  # MLflow's own HTTP retries back off for minutes against a server that is down
RUN_ID_ENV = "MLFLOW_RUN_ID"
URI_ENV = "MLFLOW_TRACKING_URI"
# ORCH_MLFLOW=0: no run arranged, for a shell that sets MLFLOW_TRACKING_URI for every program, MLflow users or not
OFF_ENV = "ORCH_MLFLOW"


def read_record(run_dir: Path) -> dict[str, Any] | None:
    """The run dir's MLflow run (``trackers.json``'s ``mlflow``), or None."""
    rec = protocol.read_trackers(run_dir).get("mlflow")
    ok = isinstance(rec, dict) and isinstance(rec.get("run_id"), str) and isinstance(rec.get("tracking_uri"), str)
    return rec if ok else None


def _write_record(run_dir: Path, rec: dict[str, Any]) -> None:
    protocol.write_tracker(run_dir, "mlflow", rec)


def arrange(run_dir: Path, job: str, attempt: int, env: dict[str, str]) -> tuple[str | None, str]:
    """(the run id to pass as ``MLFLOW_RUN_ID``, or None; a line for the attempt's log, or '')."""
    if not env.get(URI_ENV) or env.get(RUN_ID_ENV) or env.get(OFF_ENV) == "0":
        return None, ""
    argv = [sys.executable, "-m", "orchestrator.jobside.mlflowrun", "arrange", str(run_dir), job, str(int(attempt))]
    try:
        p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"no MLflow run arranged: {env[URI_ENV]} did not answer in {TIMEOUT_S:.0f} s; this attempt's " \
                     "mlflow.start_run() opens a run of its own"
    except OSError as e:
        return None, f"no MLflow run arranged: {e}"
    run_id = p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else ""
    if not run_id:
        why = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        return None, f"no MLflow run arranged ({why}); this attempt's mlflow.start_run() opens a run of its own"
    return run_id, f"MLflow run {run_id} at {env[URI_ENV]}: every attempt of this job continues it"


def _experiment_id(client: Any) -> str:
    """The experiment ``mlflow.start_run()`` would use: ``MLFLOW_EXPERIMENT_ID``, ``MLFLOW_EXPERIMENT_NAME``
    (created if missing), else the default one."""
    if os.environ.get("MLFLOW_EXPERIMENT_ID"):
        return os.environ["MLFLOW_EXPERIMENT_ID"]
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if name:
        found = client.get_experiment_by_name(name)
        return found.experiment_id if found is not None else client.create_experiment(name)
    return "0"


def _arrange_here(run_dir: Path, job: str, attempt: int) -> str:
    """In the child: find or create the job's run, tag the attempt, record it; returns the run id."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    uri = os.environ[URI_ENV]
    client = MlflowClient(tracking_uri=uri)
    rec = read_record(run_dir)
    run_id = rec["run_id"] if rec is not None and rec.get("tracking_uri") == uri else None
    if run_id is not None:
        try:
            client.get_run(run_id)
        except MlflowException:
            run_id = None  # deleted, or another store at the same URI: a new run, recorded below
    if run_id is None:
        tags = {"mlflow.runName": job, "orch.job": job, "orch.run_dir": str(run_dir)}
        if os.environ.get(protocol.ENV_SWEEP):
            tags.update({"orch.sweep": os.environ[protocol.ENV_SWEEP],
                         "orch.task_index": os.environ.get(protocol.ENV_TASK_INDEX, "")})
        run_id = client.create_run(_experiment_id(client), tags=tags).info.run_id
        _write_record(run_dir, {"tracking_uri": uri, "run_id": run_id, "created_at": protocol.now_iso(),
                                "attempt": attempt})
    else:
        # RUNNING again: Lightning's logger, which never calls start_run(), marked it FINISHED as its attempt stopped
        client.update_run(run_id, status="RUNNING")
        if "end" in rec:  # a requeue after the job's end: that end is no longer the run's
            _write_record(run_dir, {k: v for k, v in rec.items() if k != "end"})
    client.set_tag(run_id, "orch.attempt", str(attempt))
    return run_id


def latest_per_step(run_id: str, key: str, tracking_uri: str | None = None) -> list[tuple[int, float]]:
    """``key``'s history as the job's one curve: per step, the value logged last. MLflow cannot delete a metric's
    history, so after a kill -9 the steps trained again hold two values, the killed attempt's and the resumed one's
    (logged later); this keeps the resumed one's, as TensorBoard shows after orch's purge."""
    from mlflow.tracking import MlflowClient

    newest: dict[int, Any] = {}
    for m in MlflowClient(tracking_uri=tracking_uri).get_metric_history(run_id, key):
        if m.step not in newest or m.timestamp >= newest[m.step].timestamp:
            newest[m.step] = m
    return [(step, newest[step].value) for step in sorted(newest)]


STATUS = {"verified": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


def finish_here(run_dir: Path, end: str) -> str | None:
    """In the child: mark the recorded run with the status of the job's end, as orch decided it, and note it in
    ``trackers.json`` (``orch show``); None when the run dir records no MLflow run (mlflow is then not imported)."""
    rec = read_record(run_dir)
    if rec is None:
        return None
    from mlflow.tracking import MlflowClient

    status = STATUS[end]
    MlflowClient(tracking_uri=rec["tracking_uri"]).set_terminated(rec["run_id"], status)
    _write_record(run_dir, {**rec, "end": status})
    return f"MLflow run {rec['run_id']}: {status}"


def main(argv: list[str]) -> int:
    """``python -m orchestrator.jobside.mlflowrun arrange RUN_DIR JOB ATTEMPT``."""
    try:
        if argv[:1] == ["arrange"] and len(argv) == 4:
            print(_arrange_here(Path(argv[1]), argv[2], int(argv[3])))
            return 0
    except ImportError as e:
        print(f"mlflow is not importable by orch's Python ({sys.executable}): {e.name}", file=sys.stderr)
        return 3
    except Exception as e:  # one line for the attempt's log, whatever MLflow raised
        print(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
        return 1
    print("usage: python -m orchestrator.jobside.mlflowrun arrange RUN_DIR JOB ATTEMPT", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
