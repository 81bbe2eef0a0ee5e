"""OrchCallback for Lightning (examples/lightning_train.py), on the local backend through the CLI."""

from __future__ import annotations

import signal
import subprocess

import torch
from intkit import (
    assert_metrics_count_the_steps_redone,
    assert_resumed_where_it_stopped,
    example,
    failure,
    preempted_twice,
    quiet_env,
    run_direct,
    state_dicts_equal,
    step_log,
    tensorboard_scalars,
)
from orchkit import wait_for

MAX = 120


def _weights(path) -> dict:
    return torch.load(path, weights_only=False)["state_dict"]


def test_lightning_preempted_twice_redoes_no_step_ends_bit_exact_and_one_tensorboard_curve(orch, tmp_path):
    # 86 batches per epoch: the run crosses an epoch boundary; validation every 50 steps.
    args = ["--max-steps", str(MAX)]
    run_dir, log = preempted_twice(orch, "lit", "lightning_train.py", [*args, "--sleep-per-step", "0.03"])
    assert_resumed_where_it_stopped(run_dir, log, MAX)
    assert_metrics_count_the_steps_redone(orch, log)
    run_direct(example("lightning_train.py", *args), tmp_path / "ref")
    # Bit for bit: Lightning restores model/optimizer/scheduler/loops, the StatefulDataLoader its
    # position, the callback the global RNG (dropout).
    assert state_dicts_equal(_weights(run_dir / "result" / "model.ckpt"),
                             _weights(tmp_path / "ref" / "result" / "model.ckpt"))

    # One TensorBoard log dir for all three attempts, steps continuing (no restart at 0, no version_1).
    dirs, steps = tensorboard_scalars(run_dir / "tensorboard", "train_loss")
    assert dirs == ["."], dirs
    assert steps == sorted(steps) and len(steps) == len(set(steps)) and len(steps) >= MAX - 3, steps
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 3


def test_a_stop_at_a_step_that_validation_follows_resumes_bit_exact(tmp_path):
    """SIGTERM during step 10 with validation every 10 steps (no orch: ``--run-dir``). The uninterrupted run's
    validation draws from the global RNG (the val loader seeds its iterator) before step 11's dropout; a stop
    saved at step 10's batch end missed that draw and the resumed weights differed (CI, stop 17). The stop
    is taken when the validation starts; the resumed run ends bit-equal to the uninterrupted one."""
    args = ["--max-steps", "20", "--val-every", "10"]
    run_dir, log = tmp_path / "run", tmp_path / "steps.log"
    run_dir.mkdir()
    # 0.1 s a step: the signal, sent once step 9 is logged, lands inside step 10's training_step.
    p = subprocess.Popen(example("lightning_train.py", *args, "--sleep-per-step", "0.1", "--step-log", str(log),
                                 "--run-dir", str(run_dir)), cwd=run_dir, env=quiet_env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: log.exists() and 9 in [s for _, s in step_log(log)], 120, "step 9 in the step log")
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=120) == 143, p.stderr.read()
    finally:
        p.kill()
    assert failure(run_dir, 1)["step"] == 10, failure(run_dir, 1)
    resumed = subprocess.run(example("lightning_train.py", *args, "--step-log", str(log), "--run-dir", str(run_dir)),
                             cwd=run_dir, env=quiet_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [s for _, s in step_log(log)] == list(range(1, 21))
    run_direct(example("lightning_train.py", *args), tmp_path / "ref")
    assert state_dicts_equal(_weights(run_dir / "result" / "model.ckpt"),
                             _weights(tmp_path / "ref" / "result" / "model.ckpt"))
