"""orch_run around a plain PyTorch loop (examples/plain_loop.py), on the local backend through the CLI."""

from __future__ import annotations

import torch
from intkit import assert_resumed_where_it_stopped, example, preempted_twice, repeats, run_direct, state_dicts_equal
from prometheus_client.parser import text_string_to_metric_families

MAX = 120


def test_plain_loop_preempted_twice_redoes_no_step_and_ends_bit_exact(orch, tmp_path):
    args = ["--max-steps", str(MAX), "--save-every", "40"]
    run_dir, log = preempted_twice(orch, "loop", "plain_loop.py", [*args, "--sleep-per-step", "0.03"])
    assert_resumed_where_it_stopped(run_dir, log, MAX)
    # `orch metrics` counts the steps redone from the heartbeats' resumed_from; the step log is the truth
    fams = {f.name: {s.name: s.value for s in f.samples}
            for f in text_string_to_metric_families(orch("metrics", check=True).stdout)}
    redone = fams["orch_preemption_steps_redone"]
    assert (redone["orch_preemption_steps_redone_count"], redone["orch_preemption_steps_redone_sum"]) == \
        (2, repeats(log))
    run_direct(example("plain_loop.py", *args), tmp_path / "ref")
    # Bit for bit: batches come from the global torch RNG and the model has dropout; both are restored.
    assert state_dicts_equal(torch.load(run_dir / "result" / "model.pt"),
                             torch.load(tmp_path / "ref" / "result" / "model.pt"))
