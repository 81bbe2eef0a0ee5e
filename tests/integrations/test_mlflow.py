"""MLflow: a cancelled job's run ends KILLED, and a user's own run id is left alone. A real MLflow store
(SQLite), read back with ``MlflowClient``. One run across preemptions and a kill, for every integration, with the
newest value per step equal to an uninterrupted run's: test_tracker_curves.py."""

from __future__ import annotations

import sys

import pytest
from intkit import DONE
from orchkit import wait_for

from orchestrator import protocol

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402


def _runs(uri: str) -> list:
    return MlflowClient(tracking_uri=uri).search_runs(["0"])


def _status(uri: str, run_id: str) -> str:
    return MlflowClient(tracking_uri=uri).get_run(run_id).info.status


SLEEPER = """
import time, mlflow
mlflow.start_run()
mlflow.log_metric("x", 1.0, step=1)
time.sleep(600)
"""


def test_a_cancelled_job_is_a_killed_mlflow_run_and_a_user_run_id_is_left_alone(orch, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    _runs(uri)  # the store's tables exist before any job: this test polls it while the wrapper creates the run
    orch("submit", "--name", "sl", "--", sys.executable, "-c", SLEEPER, env={"MLFLOW_TRACKING_URI": uri}, check=True)
    run_dir = orch.runs / "sl"
    wait_for(lambda: len(_runs(uri)) == 1 and _runs(uri)[0].data.metrics.get("x") == 1.0 or
             (orch("reconcile") and None), 120, "the job's run logged")
    run_id = _runs(uri)[0].info.run_id
    assert protocol.read_json_bounded(run_dir / protocol.TRACKERS_FILE)["mlflow"]["run_id"] == run_id, \
        (run_dir / "attempts" / "1" / "stderr.log").read_text()
    assert _status(uri, run_id) == "RUNNING"
    orch("cancel", "sl", check=True)
    assert orch.wait("sl", {"cancelled"}, timeout=120) == "cancelled"
    wait_for(lambda: _status(uri, run_id) == "KILLED", 60, "the run KILLED")
    # The child notes the end in trackers.json just after it marks the store (CI 74 read it in between): wait on it.
    wait_for(lambda: protocol.read_json_bounded(run_dir / protocol.TRACKERS_FILE)["mlflow"].get("end") == "KILLED",
             30, "the run's end noted in trackers.json")

    # The user's own MLFLOW_RUN_ID wins: orch arranges nothing and records nothing.
    own = MlflowClient(tracking_uri=uri).create_run("0").info.run_id
    orch("submit", "--name", "own", "--outputs", "out.txt", "--", sys.executable, "-c", "import mlflow, pathlib; "
         "mlflow.start_run(); mlflow.log_metric('y', 2.0); pathlib.Path('out.txt').write_text('ok')",
         env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_RUN_ID": own}, check=True)
    assert orch.wait("own", {"failed", DONE}, timeout=120) == DONE, orch.show("own")
    assert MlflowClient(tracking_uri=uri).get_run(own).data.metrics == {"y": 2.0}
    assert not (orch.runs / "own" / protocol.TRACKERS_FILE).exists()
