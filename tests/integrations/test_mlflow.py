"""Issue 42, MLflow: one run per job, whatever the attempts; its end as orch decided it. A real MLflow store (SQLite),
read back with ``MlflowClient``; the README's plain-loop example calling plain ``mlflow.start_run()``."""

from __future__ import annotations

import os
import signal
import sys

import pytest
from intkit import DONE, attempts, example, failure, preempt, program_pids, progress_step, quiet_env, step_log
from orchkit import wait_for

from orchestrator import protocol
from orchestrator.mlflowrun import latest_per_step

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

MAX = 60


def _runs(uri: str) -> list:
    return MlflowClient(tracking_uri=uri).search_runs(["0"])


def _status(uri: str, run_id: str) -> str:
    return MlflowClient(tracking_uri=uri).get_run(run_id).info.status


def test_a_job_preempted_and_killed_is_one_mlflow_run_whose_newest_values_are_an_uninterrupted_runs(orch, tmp_path):
    orch.write_config("[policy]\ncrash_backoff_s = 1\n")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    log = tmp_path / "steps.log"
    args = ["--max-steps", str(MAX), "--save-every", "10", "--mlflow"]
    orch("submit", "--name", "ml", "--", *example("plain_loop.py", *args, "--sleep-per-step", "0.05", "--step-log",
                                                  str(log)), env={"MLFLOW_TRACKING_URI": uri}, check=True)
    run_dir = orch.runs / "ml"
    preempt(orch, "ml", "plain_loop.py", 1, 12)
    wait_for(lambda: (protocol.attempt_dir(run_dir, 1) / protocol.FAILURE_FILE).exists(), 120, "attempt 1's report")
    stop = failure(run_dir, 1)["step"]

    def attempt_2_past_a_save() -> list[int] | None:
        if not (pids := program_pids(run_dir, "plain_loop.py", 2)):
            orch("reconcile", check=True)
            return None
        return pids if progress_step(run_dir, 2) >= (stop // 10 + 1) * 10 + 5 else None

    (pid,) = wait_for(attempt_2_past_a_save, 180, "attempt 2 five steps past a save", interval=0.05)
    os.kill(pid, signal.SIGKILL)
    assert orch.wait("ml", {DONE, "failed", "cancelled"}, timeout=240) == DONE, orch.show("ml")
    assert [a["failure_class"] for a in attempts(orch, "ml")] == ["preempted", "killed", None]
    assert any(a == 3 and s <= max(s2 for a2, s2 in step_log(log) if a2 == 2) for a, s in step_log(log))

    (run,) = _runs(uri)  # one run for three attempts
    run_id = run.info.run_id
    assert (run.data.tags["orch.job"], run.data.tags["orch.attempt"], run.data.tags["mlflow.runName"]) == \
        ("ml", "3", "ml"), run.data.tags
    wait_for(lambda: _status(uri, run_id) == "FINISHED", 60, "the run FINISHED")
    shown = orch.show("ml")
    assert shown["trackers"]["mlflow"]["run_id"] == run_id, shown["trackers"]
    assert f"MLflow run: {run_id}" in orch("show", "ml", check=True).stdout

    # MLflow keeps the killed attempt's values of the steps trained again; the newest per step are the resumed ones.
    raw = MlflowClient(tracking_uri=uri).get_metric_history(run_id, "loss")
    assert len(raw) > MAX, len(raw)
    ref_uri = f"sqlite:///{tmp_path}/ref.db"
    import subprocess

    subprocess.run(example("plain_loop.py", *args, "--run-dir", str(tmp_path / "ref")), check=True, timeout=300,
                   env=quiet_env({"MLFLOW_TRACKING_URI": ref_uri}), capture_output=True)
    (ref,) = _runs(ref_uri)
    assert latest_per_step(run_id, "loss", uri) == latest_per_step(ref.info.run_id, "loss", ref_uri)
    assert [s for s, _v in latest_per_step(run_id, "loss", uri)] == list(range(1, MAX + 1))


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
    assert protocol.read_json_bounded(run_dir / protocol.TRACKERS_FILE)["mlflow"]["end"] == "KILLED"

    # The user's own MLFLOW_RUN_ID wins: orch arranges nothing and records nothing.
    own = MlflowClient(tracking_uri=uri).create_run("0").info.run_id
    orch("submit", "--name", "own", "--outputs", "out.txt", "--", sys.executable, "-c", "import mlflow, pathlib; "
         "mlflow.start_run(); mlflow.log_metric('y', 2.0); pathlib.Path('out.txt').write_text('ok')",
         env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_RUN_ID": own}, check=True)
    assert orch.wait("own", {"failed", DONE}, timeout=120) == DONE, orch.show("own")
    assert MlflowClient(tracking_uri=uri).get_run(own).data.metrics == {"y": 2.0}
    assert not (orch.runs / "own" / protocol.TRACKERS_FILE).exists()


@pytest.mark.parametrize("script, args, key", [
    ("lightning_train.py", ["--max-steps", "30", "--mlflow"], "train_loss"),
    ("hf_train.py", ["--max-steps", "30", "--mlflow"], "loss"),
], ids=["lightning", "hf"])
def test_lightning_and_hf_loggers_continue_the_jobs_one_run_across_a_preemption(orch, tmp_path, script, args, key):
    """Lightning's ``MLFlowLogger`` (given the job's run by orch's callback) and HF's ``report_to="mlflow"`` (which
    reads ``MLFLOW_RUN_ID``): one run for both attempts, every step once, FINISHED at the job's end."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    _runs(uri)  # the store's tables first
    orch("submit", "--name", "fw", "--", *example(script, *args, "--sleep-per-step", "0.05"),
         env={"MLFLOW_TRACKING_URI": uri}, check=True)
    preempt(orch, "fw", script, 1, 10)
    assert orch.wait("fw", {DONE, "failed", "cancelled"}, timeout=240) == DONE, orch.show("fw")
    assert [a["failure_class"] for a in attempts(orch, "fw")] == ["preempted", None]
    (run,) = _runs(uri)
    assert run.data.tags["orch.attempt"] == "2", run.data.tags
    wait_for(lambda: _status(uri, run.info.run_id) == "FINISHED", 60, "the run FINISHED")
    steps = [s for s, _v in latest_per_step(run.info.run_id, key, uri)]
    raw = [m.step for m in MlflowClient(tracking_uri=uri).get_metric_history(run.info.run_id, key)]
    assert sorted(raw) == steps and len(steps) >= 29, raw  # every step once: a preemption redoes none
