"""mlflowrun.arrange: the job's one MLflow run, found or created before each attempt; a tracking server that fails
costs one line in the attempt's log, never the attempt. End to end (preempted, killed, cancelled):
tests/integrations/test_tracker_curves.py and test_mlflow.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from orchestrator import protocol
from orchestrator.jobside import mlflowrun

pytest.importorskip("mlflow")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "2", **extra}


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow SQLite store with its tables made once: MLflow's migrations cost seconds per new store."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow") / "empty.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


def _store(empty_store: Path, path: Path) -> str:
    """A copy of the empty store at ``path``: its tracking URI."""
    shutil.copyfile(empty_store, path)
    return f"sqlite:///{path}"


def test_without_a_tracking_uri_or_with_the_users_own_run_id_nothing_is_arranged(tmp_path):
    env = {k: v for k, v in _env().items() if not k.startswith("MLFLOW_TRACKING")}
    assert mlflowrun.arrange(tmp_path, "j", 1, env) == (None, "")
    own = _env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/m.db", MLFLOW_RUN_ID="abc")
    assert mlflowrun.arrange(tmp_path, "j", 1, own) == (None, "")
    off = _env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/m.db", ORCH_MLFLOW="0")
    assert mlflowrun.arrange(tmp_path, "j", 1, off) == (None, "")
    assert not (tmp_path / protocol.TRACKERS_FILE).exists()


def test_every_attempt_gets_the_run_the_first_created_and_another_store_gets_its_own(tmp_path, empty_store):
    env = _env(MLFLOW_TRACKING_URI=_store(empty_store, tmp_path / "m.db"), MLFLOW_EXPERIMENT_NAME="exp")
    first, said = mlflowrun.arrange(tmp_path, "j", 1, env)
    assert first is not None and first in said, said
    assert mlflowrun.arrange(tmp_path, "j", 2, env)[0] == first
    assert mlflowrun.read_record(tmp_path)["run_id"] == first
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"]).get_run(first)
    assert (run.data.tags["orch.job"], run.data.tags["orch.attempt"]) == ("j", "2")
    assert MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"]).get_experiment(run.info.experiment_id).name == "exp"
    other = _env(MLFLOW_TRACKING_URI=_store(empty_store, tmp_path / "other.db"))
    second = mlflowrun.arrange(tmp_path, "j", 3, other)[0]
    assert second not in (None, first)


def test_a_server_that_refuses_costs_one_line_and_no_record(tmp_path):
    env = _env(MLFLOW_TRACKING_URI="http://127.0.0.1:9")  # the discard port: nothing listens
    run_id, said = mlflowrun.arrange(tmp_path, "j", 1, env)
    assert run_id is None and said.startswith("no MLflow run arranged") and "\n" not in said, said
    assert not (tmp_path / protocol.TRACKERS_FILE).exists()


def test_a_garbage_record_is_no_run(tmp_path):
    (tmp_path / protocol.TRACKERS_FILE).write_text('{"mlflow": {"run_id": 7}}')
    assert mlflowrun.read_record(tmp_path) is None
    (tmp_path / protocol.TRACKERS_FILE).write_bytes(b"\xff" * 10)
    assert mlflowrun.read_record(tmp_path) is None


def test_a_sweep_task_is_a_run_of_its_own_tagged_with_its_sweep(tmp_path, empty_store):
    uri = _store(empty_store, tmp_path / "m.db")
    ids = []
    for i in (0, 1):
        run_dir = tmp_path / f"lr-{i}"
        run_dir.mkdir()
        env = _env(MLFLOW_TRACKING_URI=uri, **{protocol.ENV_SWEEP: "lr", protocol.ENV_TASK_INDEX: str(i)})
        ids.append(mlflowrun.arrange(run_dir, f"lr-{i}", 1, env)[0])
    assert None not in ids and ids[0] != ids[1]
    from mlflow.tracking import MlflowClient

    tags = [MlflowClient(tracking_uri=uri).get_run(i).data.tags for i in ids]
    assert [(t["orch.sweep"], t["orch.task_index"], t["orch.job"]) for t in tags] == [("lr", "0", "lr-0"),
                                                                                     ("lr", "1", "lr-1")]
