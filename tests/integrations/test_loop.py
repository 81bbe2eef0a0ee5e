"""orch_run around a plain PyTorch loop (examples/plain_loop.py), on the local backend through the CLI."""

from __future__ import annotations

import torch
from intkit import (
    assert_metrics_count_the_steps_redone,
    assert_resumed_where_it_stopped,
    example,
    preempted_as_slurm_with_wandb,
    preempted_twice,
    run_direct,
    state_dicts_equal,
)

MAX = 120


def test_plain_loop_preempted_twice_redoes_no_step_and_ends_bit_exact(orch, tmp_path):
    args = ["--max-steps", str(MAX), "--save-every", "40"]
    run_dir, log = preempted_twice(orch, "loop", "plain_loop.py", [*args, "--sleep-per-step", "0.03"])
    assert_resumed_where_it_stopped(run_dir, log, MAX)
    assert_metrics_count_the_steps_redone(orch, log)
    run_direct(example("plain_loop.py", *args), tmp_path / "ref")
    # Bit for bit: batches come from the global torch RNG and the model has dropout; both are restored.
    assert state_dicts_equal(torch.load(run_dir / "result" / "model.pt"),
                             torch.load(tmp_path / "ref" / "result" / "model.pt"))


def test_a_plain_loop_with_wandb_preempted_as_slurm_does_it_loses_no_checkpoint_to_the_tracker(orch):
    """Issue 42: Slurm's SIGTERM reaches W&B's service process too, which exits; the loop's next ``wandb.log``
    raised before the step boundary where orch saves. Wrapped in ``run.tolerant``, the failure is noted and
    skipped: 0 steps redone, the report names it."""
    report, log = preempted_as_slurm_with_wandb(orch, "loopwb", "plain_loop.py", ["--max-steps", "40",
                                                                              "--sleep-per-step", "0.05"])
    assert "ignored during the stop: Run.log: " in report["detail"], report
    assert sorted(s for _a, s in log) == list(range(1, 41)), log  # every step once: none redone, none skipped
