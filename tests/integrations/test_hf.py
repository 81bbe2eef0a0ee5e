"""OrchCallback for the Hugging Face Trainer (examples/hf_train.py), on the local backend through the CLI."""

from __future__ import annotations

from intkit import (
    assert_metrics_count_the_steps_redone,
    assert_resumed_where_it_stopped,
    example,
    preempted_twice,
    run_direct,
    state_dicts_equal,
    tensorboard_scalars,
)
from safetensors.torch import load_file

from orchestrator import protocol

MAX = 100


def test_hf_preempted_twice_redoes_no_step_ends_bit_exact_one_tensorboard_curve_one_wandb_run(orch, tmp_path):
    # 85 optimizer steps per epoch: the run crosses an epoch boundary (HF skips the batches seen).
    args = ["--max-steps", str(MAX)]
    run_dir, log = preempted_twice(orch, "hf", "hf_train.py", [*args, "--sleep-per-step", "0.03", "--wandb"])
    assert_resumed_where_it_stopped(run_dir, log, MAX)
    assert_metrics_count_the_steps_redone(orch, log)
    run_direct(example("hf_train.py", *args), tmp_path / "ref")
    # Bit for bit: HF restores model/optimizer/scheduler/RNG and skips the batches already trained on.
    assert state_dicts_equal(load_file(run_dir / "result" / "model.safetensors"),
                             load_file(tmp_path / "ref" / "result" / "model.safetensors"))

    dirs, steps = tensorboard_scalars(run_dir / "tensorboard", "train/loss")
    assert dirs == ["."], dirs
    assert steps == list(range(1, MAX + 1)), steps  # logging_steps=1: every step once, in order

    # W&B offline: one run dir per attempt, all with the same run id (orch's WANDB_RUN_ID).
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 3, runs
    run_id = protocol.stable_run_id(run_dir, "hf")
    assert all(p.name.endswith(f"-{run_id}") for p in runs), (run_id, runs)
