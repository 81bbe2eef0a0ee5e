"""OrchCallback for Lightning (examples/lightning_train.py), on the local backend through the CLI."""

from __future__ import annotations

import torch
from intkit import (
    assert_metrics_count_the_steps_redone,
    assert_resumed_where_it_stopped,
    example,
    preempted_twice,
    run_direct,
    state_dicts_equal,
    tensorboard_scalars,
)

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
