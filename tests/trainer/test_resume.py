"""Preemption and exact resume: stop anywhere, resume, and end bit-identical to an uninterrupted run."""

from __future__ import annotations

import json
import random
import shutil
import signal
import time

import pytest
import torch
from orchkit import wait_for
from trainerkit import (
    BASE_ARGS,
    assert_bit_identical,
    committed,
    failure,
    progress_step,
    result_state,
    run_config,
    run_inproc,
    run_trainer,
    spawn_trainer,
)

from orch_trainer import loop as trainer_loop
from orchestrator import protocol
from orchestrator.kit.checkpoint import CheckpointManager

ARGS = (*BASE_ARGS, "--max-steps", "12")


@pytest.mark.parametrize("stop_at", [
    (1, 0),   # before the first step completes: nothing to save, resume starts fresh
    (3, 1),   # mid-accumulation: micro-batch 0 of step 3 is discarded
    (5, 0),   # first boundary after the periodic save of step 4
    (6, 1),   # mid-accumulation, between two periodic saves
    (9, 0),   # right after the background save of step 8 was started (it must commit first)
    (12, 1),  # mid-accumulation of the very last step
])
def test_stop_anywhere_then_resume_is_bit_identical(tmp_path, baseline, stop_at):
    rd = tmp_path / "run"
    assert run_inproc(rd, *ARGS, stop_at=stop_at) == protocol.EXIT_PREEMPTED
    f = failure(rd)
    step = stop_at[0] - 1  # the last COMPLETED step
    assert f["class"] == "preempted" and f["step"] == step
    if step:
        assert f["checkpoint"] == f"checkpoints/{protocol.checkpoint_name(step)}"
        assert protocol.verify_checkpoint(rd / f["checkpoint"]) is None
        assert f["micro_batches_discarded"] == stop_at[1]
    else:
        assert f["checkpoint"] is None and committed(rd) == []
    assert run_inproc(rd, *ARGS, attempt=2) == 0
    assert run_config(rd)["resumed_from_step"] == (step or None)
    assert_bit_identical(result_state(rd), baseline(*ARGS))


def test_two_interruptions_in_one_run_dir_still_bit_identical(tmp_path, baseline):
    rd = tmp_path / "run"
    assert run_inproc(rd, *ARGS, stop_at=(4, 1)) == protocol.EXIT_PREEMPTED
    assert run_inproc(rd, *ARGS, stop_at=(10, 1), attempt=2) == protocol.EXIT_PREEMPTED
    assert failure(rd, 2)["step"] == 9
    assert run_inproc(rd, *ARGS, attempt=3) == 0
    assert_bit_identical(result_state(rd), baseline(*ARGS))


def test_optimizer_and_rng_state_of_a_resumed_checkpoint_match_the_uninterrupted_one(tmp_path):
    """Not only the weights: the step-12 checkpoint (optimizer moments, LR schedule, RNG) is identical."""
    ref, rd = tmp_path / "ref", tmp_path / "run"
    assert run_inproc(ref, *ARGS) == 0
    assert run_inproc(rd, *ARGS, stop_at=(7, 1)) == protocol.EXIT_PREEMPTED
    assert run_inproc(rd, *ARGS, attempt=2) == 0
    a = CheckpointManager.load(ref / "checkpoints" / "step-00000012")
    b = CheckpointManager.load(rd / "checkpoints" / "step-00000012")
    assert_bit_identical(a["model.pt"], b["model.pt"])
    opt_a, opt_b = a["optim.pt"]["state"], b["optim.pt"]["state"]
    assert opt_a.keys() == opt_b.keys()
    for k in opt_a:
        assert_bit_identical(opt_a[k], opt_b[k])
    assert a["sched.pt"] == b["sched.pt"]
    assert torch.equal(a["rng.pt"]["torch"], b["rng.pt"]["torch"])


def older_trainer_capture_rng() -> dict:
    """The bundled trainer's own RNG format, before it used the kit's (orchestrator.kit.rng)."""
    return {"python": random.getstate(), "torch_cpu": torch.get_rng_state()}


def older_trainer_state_files(model, optimizer, scheduler, rng, meta) -> dict:
    """The bundled trainer's checkpoint layout before the kit's: optimizer and scheduler nested in optim.pt."""
    return {"model.pt": model.state_dict(),
            "optim.pt": {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
            "rng.pt": rng, "meta.json": meta}


def test_a_checkpoint_the_trainer_wrote_in_its_older_format_resumes_bit_identical(tmp_path, baseline, monkeypatch):
    """The trainer now writes the kit's RNG format and layout (rng.pt's torch/cuda, sched.pt), and still resumes
    what it wrote before (rng.pt's torch_cpu/torch_cuda, optim.pt holding the scheduler): no run in flight during an
    upgrade starts over or drifts."""
    rd = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(trainer_loop, "capture_rng", older_trainer_capture_rng)
        m.setattr(trainer_loop, "state_files", older_trainer_state_files)
        assert run_inproc(rd, *ARGS, stop_at=(7, 1)) == protocol.EXIT_PREEMPTED
    older = CheckpointManager.load(rd / "checkpoints" / "step-00000006")
    assert "torch_cpu" in older["rng.pt"] and "torch" not in older["rng.pt"] and "sched.pt" not in older
    assert run_inproc(rd, *ARGS, attempt=2) == 0
    assert run_config(rd)["resumed_from_step"] == 6
    newer = CheckpointManager.load(rd / "checkpoints" / "step-00000012")
    assert "torch" in newer["rng.pt"] and "torch_cpu" not in newer["rng.pt"] and "sched.pt" in newer
    assert_bit_identical(result_state(rd), baseline(*ARGS))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2])
def test_real_signal_saves_last_completed_step_and_loses_at_most_one_step(tmp_path, baseline, sig):
    """A real signal (os.kill) to `python -m orch_trainer`; then measure the work lost across the two attempts."""
    args = (*BASE_ARGS, "--max-steps", "60", "--micro-batch-size", "2", "--save-interval", "25")
    accum = 4
    rd = tmp_path / "run"
    proc = spawn_trainer(rd, *args)
    try:
        wait_for(lambda: progress_step(rd) >= 12, what="step 12")
        sent = time.time()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == protocol.EXIT_PREEMPTED, err
    f = failure(rd)
    assert sent <= f["stop_requested_time"] <= time.time()  # when the signal arrived, not when saved
    assert f["class"] == "preempted" and 12 <= f["step"] < 60
    assert f["detail"].startswith(signal.Signals(sig).name)
    assert f["checkpoint"] == f"checkpoints/{protocol.checkpoint_name(f['step'])}"
    assert protocol.verify_checkpoint(rd / f["checkpoint"]) is None
    p = run_trainer(rd, *args, attempt=2)
    assert p.returncode == 0, p.stderr
    assert run_config(rd)["resumed_from_step"] == f["step"]
    metrics = json.loads((rd / "result" / "metrics.json").read_text())
    # Work lost = micro-batches computed over both attempts beyond what one clean run computes.
    lost_micro = f["micro_batches_computed"] + metrics["micro_batches_computed"] - 60 * accum
    assert 0 <= lost_micro == f["micro_batches_discarded"] < accum
    assert lost_micro / accum <= 1, f"lost {lost_micro / accum:.2f} steps to one {sig.name}"
    assert_bit_identical(result_state(rd), baseline(*args))


def test_sigterm_during_startup_is_preempted_not_killed(tmp_path):
    """The handler is installed before torch is imported: an early SIGTERM still ends as 'preempted'."""
    rd = tmp_path / "run"
    proc = spawn_trainer(rd, *BASE_ARGS, "--max-steps", "5")
    try:
        wait_for(lambda: (protocol.attempt_dir(rd, 1) / protocol.PROGRAM_FILE).exists(), what="program.json")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == protocol.EXIT_PREEMPTED, err
    f = failure(rd)
    assert (f["class"], f["step"], f["checkpoint"]) == ("preempted", 0, None)


def test_injected_sigkill_then_resume_is_bit_identical(tmp_path, baseline):
    """No save on SIGKILL: the retry resumes from the last periodic checkpoint and still matches."""
    args = (*BASE_ARGS, "--max-steps", "12", "--save-interval", "3")
    rd = tmp_path / "run"
    p = run_trainer(rd, *args, "--inject-fault", "sigkill@step=8")
    assert p.returncode == -signal.SIGKILL
    # Step 6's background save commits within ~2 steps; on a loaded machine the kill may beat it.
    newest = protocol.checkpoint_step(rd / "checkpoints" / committed(rd)[-1])
    assert newest in (3, 6)
    assert not (protocol.attempt_dir(rd, 1) / protocol.FAILURE_FILE).exists()
    p = run_trainer(rd, *args, "--inject-fault", "sigkill@step=8", attempt=2)  # same command; it fired once
    assert p.returncode == 0, p.stderr
    assert run_config(rd)["resumed_from_step"] == newest
    assert_bit_identical(result_state(rd), baseline(*args))


def test_injected_sigterm_fault_is_a_real_signal_mid_accumulation(tmp_path):
    rd = tmp_path / "run"
    p = run_trainer(rd, *BASE_ARGS, "--max-steps", "12", "--inject-fault", "sigterm@step=6")
    assert p.returncode == protocol.EXIT_PREEMPTED, p.stderr
    f = failure(rd)
    assert (f["class"], f["step"], f["micro_batches_discarded"]) == ("preempted", 5, 1)
    assert f["detail"].startswith("SIGTERM")


def test_skip_batches_is_an_absolute_data_offset(tmp_path, baseline):
    """--skip-batches N: step s trains on batch s+N, so resuming with the same N repeats nothing."""
    args = (*ARGS, "--skip-batches", "5")
    rd = tmp_path / "run"
    assert run_inproc(rd, *args, stop_at=(6, 1)) == protocol.EXIT_PREEMPTED
    assert run_inproc(rd, *args, attempt=2) == 0
    assert_bit_identical(result_state(rd), baseline(*args))
    skipped, plain = baseline(*args), baseline(*ARGS)
    assert any(not torch.equal(skipped[k], plain[k]) for k in plain), "--skip-batches changed nothing"


def test_a_resume_at_the_last_step_trains_nothing_and_reports_the_final_loss_of_its_checkpoint(tmp_path):
    """A stop that lands after the last step (CI 60, two ranks, step 60 of 60) resumes at the end: the next attempt
    trains no step, and its result still says the last step's loss (it said None)."""
    rd = tmp_path / "run"
    assert run_inproc(rd, *ARGS) == 0
    first = json.loads((rd / "result" / "metrics.json").read_text())
    assert isinstance(first["final_loss"], float), first
    assert CheckpointManager.load(rd / "checkpoints" / "step-00000012")["meta.json"]["loss"] == first["final_loss"]
    (rd / protocol.DONE_MARKER).unlink()  # as if the stop had landed after step 12, before completion
    shutil.rmtree(rd / "result")
    assert run_inproc(rd, *ARGS, attempt=2) == 0
    again = json.loads((rd / "result" / "metrics.json").read_text())
    assert (again["resumed_from_step"], again["attempt"]) == (12, 2), again
    assert again["final_loss"] == first["final_loss"], (first, again)
