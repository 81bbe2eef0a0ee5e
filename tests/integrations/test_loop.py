"""orch_run around a plain PyTorch loop (examples/plain_loop.py), on the local backend through the CLI."""

from __future__ import annotations

import os
import signal

import torch
from intkit import (
    DONE,
    PY,
    attempts,
    example,
    failure,
    rank_pid,
    rank_step_log,
    run_direct,
    state_dicts_equal,
)
from orchkit import wait_for

MAX = 120


def test_plain_loop_ddp_on_two_ranks_a_signal_to_one_rank_stops_both_and_resumes_bit_exact(orch, tmp_path):
    """The README's plain-loop example under ``--nproc-per-node 2`` is DDP (gloo), not two copies of one
    run. SIGTERM to rank 1 alone: both ranks stop after the same step, checkpointed; attempt 2 starts right after
    it on both, and the result is bit-equal to an uninterrupted torchrun run (each rank's batches come from its
    own RNG, which orch restores per rank)."""
    max_steps, log = 60, tmp_path / "steps.log"
    orch("submit", "--name", "loopddp", "--nproc-per-node", "2", "--", *example(
        "plain_loop.py", "--max-steps", str(max_steps), "--save-every", "20", "--sleep-per-step", "0.05",
        "--step-log", str(log)), env={"OMP_NUM_THREADS": "1"}, check=True)
    run_dir = orch.runs / "loopddp"
    pid = wait_for(lambda: rank_pid(run_dir, 1, "plain_loop.py")
                   if any(r == 1 and s > 25 for _a, r, s in rank_step_log(log)) else None,
                   180, "rank 1 past step 25", interval=0.02)
    os.kill(pid, signal.SIGTERM)
    assert orch.wait("loopddp", {DONE, "failed", "cancelled"}, timeout=240) == DONE, orch.show("loopddp")
    assert [a["failure_class"] for a in attempts(orch, "loopddp")] == ["preempted", None]
    stop, done = failure(run_dir, 1)["step"], rank_step_log(log)
    assert 25 < stop < max_steps, stop
    assert {max(s for a, r, s in done if a == 1 and r == rank) for rank in (0, 1)} == {stop}, done
    assert {min(s for a, r, s in done if a == 2 and r == rank) for rank in (0, 1)} == {stop + 1}, done
    ref = tmp_path / "ref"
    run_direct([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                *example("plain_loop.py", "--max-steps", str(max_steps), "--save-every", "20")[1:]], ref)
    assert state_dicts_equal(torch.load(run_dir / "result" / "model.pt"), torch.load(ref / "result" / "model.pt"))
