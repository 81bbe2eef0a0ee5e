"""Issue 42 step 3: no step twice, none backwards. A job killed -9 mid-run resumes from its last checkpoint and trains
the steps after it again; what TensorBoard shows from the resume step on is the resumed attempt's, so the job's one
curve equals an uninterrupted run's, point for point. Real programs, real SIGKILL, TensorBoard's own reader."""

from __future__ import annotations

import os
import signal

import pytest
from intkit import DONE, attempts, example, program_pids, progress_step, run_direct, step_log
from orchkit import wait_for

CASES = [  # (example, its arguments, the TensorBoard tag of its training loss)
    ("plain_loop.py", ["--max-steps", "40", "--save-every", "10", "--tensorboard"], "loss"),
    ("lightning_train.py", ["--max-steps", "40", "--save-every", "10"], "train_loss"),
    ("hf_train.py", ["--max-steps", "40", "--save-steps", "10"], "train/loss"),
]


def curve(log_dir, tag: str) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` as TensorBoard shows it: its accumulator applies the purges it reads."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.parametrize("script, args, tag", CASES, ids=[c[0].split("_")[0] for c in CASES])
def test_a_job_killed_mid_run_shows_one_tensorboard_curve_equal_to_an_uninterrupted_runs(orch, tmp_path, script,
                                                                                          args, tag):
    orch.write_config("[policy]\ncrash_backoff_s = 1\n")
    log = tmp_path / "steps.log"
    orch("submit", "--name", "tb", "--", *example(script, *args, "--sleep-per-step", "0.05", "--step-log", str(log)),
         check=True)
    run_dir = orch.runs / "tb"
    (pid,) = wait_for(lambda: program_pids(run_dir, script, 1) if progress_step(run_dir, 1) >= 16 else None, 180,
                      "attempt 1 past step 16", interval=0.02)
    os.kill(pid, signal.SIGKILL)
    assert orch.wait("tb", {DONE, "failed", "cancelled"}, timeout=240) == DONE, orch.show("tb")
    assert [a["failure_class"] for a in attempts(orch, "tb")] == ["killed", None]
    done = step_log(log)
    resumed = min(s for a, s in done if a == 2) - 1
    assert resumed < max(s for a, s in done if a == 1), done  # steps were trained twice: the curve had them twice
    # orch show names them (from the heartbeats: at most a beat behind): W&B keeps attempt 1's values there.
    first, last = attempts(orch, "tb")[1]["trained_again"]
    assert first == resumed + 1 and resumed < last <= max(s for a, s in done if a == 1), (first, last, done)
    assert f"trained again: steps {first}..{last}" in orch("show", "tb", check=True).stdout
    ref = tmp_path / "ref"
    run_direct(example(script, *args), ref)
    shown, uninterrupted = curve(run_dir / "tensorboard", tag), curve(ref / "tensorboard", tag)
    steps = [s for s, _v in shown]
    assert steps == sorted(set(steps)), shown  # no step twice, none backwards
    assert shown == uninterrupted, (shown, uninterrupted)
