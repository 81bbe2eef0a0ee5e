"""`--save-interval auto` in the bundled trainer (real steps, real saves): it saves at Daly's interval for the
save cost it measures and the MTBF orch hands it, and the interval follows the cost when saves get slower."""

from __future__ import annotations

import time

import pytest
from trainerkit import BASE_ARGS, run_inproc

from orchestrator import protocol
from orchestrator.kit.interval import daly_interval

SLOW_FROM = 40  # from this step on, every save takes 0.3 s longer (a slower disk)


def test_auto_interval_follows_the_measured_save_cost(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_MTBF_S", "3")  # what orch would hand over: ~one unwarned failure per 3 s
    slowed: set[int] = set()

    def hook(trainer, step: int, micro: int) -> None:
        # Every step takes at least 30 ms: the run must outlast two slow intervals (~1.5 s each) after SLOW_FROM
        # however fast this machine trains (unloaded CI ran all 120 steps within one of them: 1 slow save).
        if micro == 0:
            time.sleep(0.03)
        if step == 1 and micro == 0:
            inner = trainer.ckpts.write_hook

            def slow(save_step: int, path: str) -> None:
                if save_step >= SLOW_FROM and save_step not in slowed:
                    slowed.add(save_step)
                    time.sleep(0.3)
                inner(save_step, path)
            trainer.ckpts.write_hook = slow

    rc = run_inproc(tmp_path, *BASE_ARGS, "--save-interval", "auto", "--no-background-save", "--max-steps", "120",
                    hook=hook)
    assert rc == 0
    saves = [b for b in protocol.read_progress_history(tmp_path, 1) if "saved_step" in b and "save_cost_s" in b]
    assert saves[-1]["saved_step"] == 120  # the final step, committed when training ends
    saves = saves[:-1]  # the interval's saves
    assert all(b["mtbf_s"] == 3 for b in saves)
    for b in saves:  # the interval in force is Daly's for the smoothed cost, every time
        assert b["save_interval_s"] == pytest.approx(max(0.25, daly_interval(b["save_cost_s"], 3)), rel=1e-6)
    fast = [b for b in saves if b["saved_step"] < SLOW_FROM]
    slow = [b for b in saves if b["saved_step"] >= SLOW_FROM]
    assert len(fast) >= 2 and len(slow) >= 2, [b["saved_step"] for b in saves]
    assert slow[-1]["save_cost_s"] >= 0.2 > fast[-1]["save_cost_s"]
    assert slow[-1]["save_interval_s"] > fast[-1]["save_interval_s"]
    # No save comes before the interval in force has passed since the one before. (An upper bound on the gap was a
    # wall-clock assert: on a loaded CI machine (CI 79) five steps took 2.6 s and a save came 2.64 s after the one
    # before, against an interval of 1.45 s; how late a save may come depends on the step time, not on the kit.)
    for a, b in zip(saves, saves[1:], strict=False):
        assert b["time"] - a["time"] >= a["save_interval_s"] - 0.05, (a, b)
    # How late one may come is the step time's business (the save waits for the step in flight): that the interval
    # follows the cost is what the assertions above hold.


def test_a_resumed_attempt_keeps_its_predecessors_save_cost_and_does_not_save_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_MTBF_S", "3")
    args = (*BASE_ARGS, "--save-interval", "auto", "--no-background-save", "--max-steps", "40")
    assert run_inproc(tmp_path, *args, attempt=1, stop_at=(12, 0)) == protocol.EXIT_PREEMPTED
    cost = protocol.read_progress(tmp_path, 1)["save_cost_s"]
    assert run_inproc(tmp_path, *args, attempt=2) == 0
    beats = protocol.read_progress_history(tmp_path, 2)
    resumed = beats[0]["resumed_from"]
    assert beats[0]["save_cost_s"] == cost  # δ carried over from attempt 1's last heartbeat
    saves = [b["saved_step"] for b in beats if "saved_step" in b]
    assert resumed + 1 not in saves  # no save at the first step just to measure δ again
