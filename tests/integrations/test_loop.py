"""orch_run around a plain PyTorch loop (examples/plain_loop.py), on the local backend through the CLI."""

from __future__ import annotations

import torch
from intkit import (
    assert_metrics_count_the_steps_redone,
    assert_resumed_where_it_stopped,
    example,
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
