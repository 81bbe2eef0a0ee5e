"""Every tracker at once, through every kind of end. A job of each integration logs to TensorBoard, MLflow and
W&B (offline) while it is preempted as Slurm does it (the program and W&B's service process signalled together),
preempted again (the program alone), then killed -9, and resumes each time. Read back with each tracker's own reader
(TensorBoard's event accumulator, ``MlflowClient``, W&B's offline transaction log) and compared point for point with
an uninterrupted run of the same example (CPU, same seed):

- no tracker costs a checkpoint: the Slurm-like preemption redoes 0 steps (HF's report names the failed W&B call);
- TensorBoard: one curve, equal to the uninterrupted run's (orch's purge replaces the steps trained again);
- MLflow: one run for four attempts, FINISHED, its newest value per step equal to the uninterrupted run's;
- W&B: one run id in every attempt's offline file, each attempt's steps increasing with the uninterrupted run's
  values; the attempts that ended reported exit code 0, the two whose W&B service died lost what it had not yet
  written (docs/trackers.md).

Each integration's own resume is held here too (these tests were each integration's "preempted twice" test): the run
crosses an epoch boundary (HF skips the batches it trained on, Lightning's loader resumes mid-epoch), each preempted
attempt saved at the step it stopped and named that checkpoint, ``orch metrics`` measured 0 steps redone for both
preemptions, ``orch verify`` says VERIFIED, and the final weights equal the uninterrupted run's bit for bit (the
model, optimizer, scheduler, data position and RNG all restored, dropout included).
"""

from __future__ import annotations

import os
import signal

import pytest
import torch
from intkit import (
    DONE,
    attempts,
    example,
    failure,
    preempt,
    program_pids,
    progress_step,
    quiet_env,
    run_direct,
    state_dicts_equal,
    step_log,
)
from orchkit import wait_for
from wandbfiles import offline_runs

from orchestrator import protocol

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from orchestrator.jobside.mlflowrun import latest_per_step  # noqa: E402

MAX, SAVE = 100, 10  # past the first epoch of HF's (85 steps) and Lightning's (86) examples
TRACKERS = ["--wandb", "--mlflow", "--sleep-per-step", "0.05"]
CASES = [  # (example, its arguments, the loss's name in TensorBoard, MLflow, W&B; W&B's step key; the failed call)
    # the failed call named only where one always falls between the signal and the save: HF logs each step before
    # its save. The loop's W&B call comes late in a step, and a signal after it stops at the next step's start.
    ("plain_loop.py", ["--save-every", str(SAVE), "--tensorboard"], "loss", "loss", "loss", "_step", None),
    # a validation after every step: a save waits for its start (exactness). A signal during a validation stops at
    # its batch end, before any logger call: which call failed, if any, depends on where the signal fell.
    ("lightning_train.py", ["--save-every", str(SAVE), "--val-every", "1"], "train_loss", "train_loss", "train_loss",
     "trainer/global_step", None),
    ("hf_train.py", ["--save-steps", str(SAVE)], "train/loss", "loss", "train/loss", "train/global_step",
     "WandbCallback.on_log: ConnectionResetError"),
]


def final_weights(script: str, run_dir) -> dict:
    """The model each example saves into result/ when training ends."""
    if script == "hf_train.py":
        from safetensors.torch import load_file

        return load_file(run_dir / "result" / "model.safetensors")
    if script == "lightning_train.py":
        return torch.load(run_dir / "result" / "model.ckpt", weights_only=False)["state_dict"]
    return torch.load(run_dir / "result" / "model.pt")


def preemptions_redone(orch) -> tuple[float, float, float]:
    """``orch metrics``: (preemptions measured, steps they redid, preemptions unmeasured)."""
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: {s.name: s.value for s in f.samples}
            for f in text_string_to_metric_families(orch("metrics", check=True).stdout)}
    redone = fams["orch_preemption_steps_redone"]
    return (redone["orch_preemption_steps_redone_count"], redone["orch_preemption_steps_redone_sum"],
            fams["orch_preemptions_unmeasured"]["orch_preemptions_unmeasured"])


def curve(log_dir, tag: str) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` as TensorBoard shows it: its accumulator applies the purges it reads."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def _mlflow_run(uri: str):
    """The store's one run, whichever experiment holds it (Lightning's logger makes its own without orch)."""
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return run


def _wandb_points(wandb_dir, step_key: str, key: str) -> list[list[tuple[int, float]]]:
    """Per attempt's offline file, its (step, value) of ``key``."""
    return [[(row[step_key], row[key]) for row in run.rows if key in row] for run in offline_runs(wandb_dir)]


@pytest.mark.parametrize("script, args, tb_tag, ml_key, wb_key, wb_step, failed_call", CASES,
                         ids=[c[0].split("_")[0] for c in CASES])
def test_preempted_twice_and_killed_each_tracker_shows_one_run_with_an_uninterrupted_runs_values(
        orch, tmp_path, script, args, tb_tag, ml_key, wb_key, wb_step, failed_call):
    orch.write_config("[policy]\ncrash_backoff_s = 1\n")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(tracking_uri=uri).search_runs(["0"])  # the store's tables exist before the wrapper arranges a run
    log = tmp_path / "steps.log"
    argv = example(script, "--max-steps", str(MAX), *args, *TRACKERS)
    orch("submit", "--name", "tr", "--", *argv, "--step-log", str(log), check=True,
         env={"MLFLOW_TRACKING_URI": uri, "WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    run_dir = orch.runs / "tr"
    preempt(orch, "tr", script, 1, 8, as_slurm=True)  # W&B's service dies with the program's signal
    wait_for(lambda: (protocol.attempt_dir(run_dir, 1) / protocol.FAILURE_FILE).exists(), 120, "attempt 1's report")
    first = failure(run_dir, 1)
    assert failed_call is None or failed_call in first["detail"], first  # a tracker call failed; the save went on
    preempt(orch, "tr", script, 2, first["step"] + 6)
    wait_for(lambda: (protocol.attempt_dir(run_dir, 2) / protocol.FAILURE_FILE).exists(), 120, "attempt 2's report")
    second = failure(run_dir, 2)

    def attempt_3_past_a_save() -> list[int] | None:
        if not (pids := program_pids(run_dir, script, 3)):
            orch.reconcile_paced()
            return None
        return pids if progress_step(run_dir, 3) >= (second["step"] // SAVE + 1) * SAVE + 5 else None

    (pid,) = wait_for(attempt_3_past_a_save, 180, "attempt 3 five steps past a save", interval=0.02)
    os.kill(pid, signal.SIGKILL)
    assert orch.wait("tr", {DONE, "failed", "cancelled"}, timeout=240) == DONE, orch.show("tr")
    shown = attempts(orch, "tr")
    assert [a["failure_class"] for a in shown] == ["preempted", "preempted", "killed", None], shown
    done = step_log(log)
    for n, report in ((1, first), (2, second)):  # a preemption redoes no step, W&B's death included
        assert max(s for a, s in done if a == n) == report["step"], (n, report, done)
        assert min(s for a, s in done if a == n + 1) == report["step"] + 1, (n, report, done)
        assert report["checkpoint"] == f"checkpoints/{protocol.checkpoint_name(report['step'])}", report
    assert sorted({s for _a, s in done}) == list(range(1, MAX + 1)), done
    assert preemptions_redone(orch) == (2, 0, 0)  # the kill is no preemption; both preemptions measured, 0 redone
    v = orch("verify", "tr")
    assert (v.returncode, v.stdout) == (0, "VERIFIED\n"), v.stdout + v.stderr
    resumed = min(s for a, s in done if a == 4) - 1
    assert resumed < max(s for a, s in done if a == 3), done  # the kill: steps trained twice
    # orch show names them (from the heartbeats: at most a beat behind)
    again_first, again_last = shown[3]["trained_again"]
    assert again_first == resumed + 1 and resumed < again_last <= max(s for a, s in done if a == 3), shown[3]
    assert f"trained again: steps {again_first}..{again_last}" in orch("show", "tr", check=True).stdout

    ref = tmp_path / "ref"
    ref_uri = f"sqlite:///{tmp_path}/ref.db"
    run_direct(argv, ref, env=quiet_env({"MLFLOW_TRACKING_URI": ref_uri}))
    assert state_dicts_equal(final_weights(script, run_dir), final_weights(script, ref))  # bit for bit

    # TensorBoard: one curve, the uninterrupted run's, point for point.
    shown_tb = curve(run_dir / "tensorboard", tb_tag)
    assert [s for s, _v in shown_tb] == sorted({s for s, _v in shown_tb}), shown_tb  # no step twice, none backwards
    assert shown_tb == curve(ref / "tensorboard", tb_tag)

    # MLflow: one run for four attempts, ended as orch decided; per step, the newest value is the uninterrupted one.
    run = _mlflow_run(uri)
    assert (run.data.tags["orch.job"], run.data.tags["orch.attempt"]) == ("tr", "4"), run.data.tags
    wait_for(lambda: _mlflow_run(uri).info.status == "FINISHED", 60, "the MLflow run FINISHED")
    assert orch.show("tr")["trackers"]["mlflow"]["run_id"] == run.info.run_id
    raw = MlflowClient(tracking_uri=uri).get_metric_history(run.info.run_id, ml_key)
    newest = latest_per_step(run.info.run_id, ml_key, uri)
    assert len(raw) > len(newest) == MAX, (len(raw), newest)  # the kill's steps were logged twice
    assert newest == latest_per_step(_mlflow_run(ref_uri).info.run_id, ml_key, ref_uri)

    # W&B: one run id; every point logged is the uninterrupted run's. Its service writes the offline file every
    # 15 s (x_transaction_log_flush_interval): an attempt whose service was killed, or that was killed, kept only
    # what the last write held, here nothing (attempts last seconds). The attempts that ended reported it.
    files = offline_runs(run_dir / "wandb")
    run_id = protocol.stable_run_id(run_dir, "tr")
    assert len(files) == 4 and {f.run_id for f in files} <= {None, run_id}, files
    assert (files[1].run_id, files[3].run_id, files[1].exit_code, files[3].exit_code) == (run_id, run_id, 0, 0), files
    assert files[0].exit_code is None and files[2].exit_code is None, files  # killed: no end reported
    ((uninterrupted),) = _wandb_points(ref / "wandb", wb_step, wb_key)
    ref_value = dict(uninterrupted)
    per_attempt = _wandb_points(run_dir / "wandb", wb_step, wb_key)
    for points in per_attempt:
        assert [s for s, _v in points] == sorted({s for s, _v in points}), points
        assert all(ref_value[s] == v for s, v in points), (points, uninterrupted)
    # W&B's own step is the framework's (kit/wandbstep.py): W&B keeps a step's first row, so the curve never goes back
    rows = [row for f in files for row in f.rows if wb_key in row]
    assert rows and all(row["_step"] == row[wb_step] for row in rows), rows[:3]
    assert per_attempt[1] and per_attempt[3][-1] == uninterrupted[-1], per_attempt
