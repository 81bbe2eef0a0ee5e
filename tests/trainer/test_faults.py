"""Each failure takes its real path and ends in its specific class; every retryable one really retries."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
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
    tmp_entries,
)

from orch_trainer.faults import cpu_oom_error
from orch_trainer.model import PRESETS, TinyGPT
from orchestrator import protocol
from orchestrator.kit.checkpoint import CheckpointManager


# --- OOM ----------------------------------------------------------------------------------------
def test_oom_halves_micro_batch_keeps_effective_batch_and_finishes(tmp_path):
    rd = tmp_path / "run"
    p = run_trainer(rd, "--max-steps", "20", "--batch-size", "8", "--micro-batch-size", "4",
                    "--inject-fault", "oom@step=5")
    assert p.returncode == 0, p.stderr
    assert "OOM at step 5: micro-batch 4 -> 2" in p.stderr
    assert protocol.verify_done_marker(rd).verified
    cfg = run_config(rd)
    assert (cfg["micro_batch_size"], cfg["batch_size"], cfg["accumulation_steps"]) == (2, 8, 4)
    [event] = cfg["oom_events"]
    assert (event["step"], event["micro_batch_size_before"], event["micro_batch_size"]) == (5, 4, 2)
    assert "DefaultCPUAllocator" in event["detail"]
    metrics = json.loads((rd / "result" / "metrics.json").read_text())
    assert metrics["steps"] == 20 and metrics["micro_batch_size"] == 2


@pytest.mark.parametrize("where", ["injected fault, first forward", "raised mid-accumulation"])
def test_oom_retry_redoes_the_same_step_from_its_start(tmp_path, where):
    """Bit-identical to stopping cleanly before step 3 and resuming it with micro-batch 2.

    So the retry discards the partial gradients, restores the step's RNG state and redraws the same
    samples: nothing of the failed attempt at step 3 leaks into the weights.
    """
    args = (*BASE_ARGS, "--max-steps", "8")
    ref = tmp_path / "ref"
    assert run_inproc(ref, *args, stop_at=(3, 0)) == protocol.EXIT_PREEMPTED
    assert run_inproc(ref, *args, "--micro-batch-size", "2", attempt=2) == 0
    rd = tmp_path / "run"
    if where.startswith("injected"):
        assert run_inproc(rd, *args, "--inject-fault", "oom@step=3") == 0
    else:
        fired = []

        def oom_after_first_micro_batch(trainer, step, micro):
            if (step, micro) == (3, 1) and not fired:
                fired.append(1)
                raise cpu_oom_error("(test)")
        assert run_inproc(rd, *args, hook=oom_after_first_micro_batch) == 0
    assert run_config(rd)["micro_batch_size"] == 2
    assert_bit_identical(result_state(rd), result_state(ref))


def test_oom_at_micro_batch_1_is_class_oom(tmp_path):
    rd = tmp_path / "run"
    p = run_trainer(rd, "--max-steps", "10", "--batch-size", "1", "--micro-batch-size", "1",
                    "--inject-fault", "oom@step=3")
    assert p.returncode == protocol.EXIT_FAILURE_REPORTED, p.stderr
    f = failure(rd)
    assert (f["class"], f["step"], f["micro_batch_size"]) == ("oom", 3, 1)
    assert not protocol.verify_done_marker(rd).verified


def test_resume_after_in_process_oom_keeps_the_smaller_micro_batch(tmp_path):
    rd = tmp_path / "run"
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "12", "--inject-fault", "oom@step=2",
                      stop_at=(6, 1)) == protocol.EXIT_PREEMPTED
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "12", attempt=2) == 0
    cfg = run_config(rd)
    assert cfg["micro_batch_size"] == 2 and cfg["batch_size"] == 8
    assert [e["step"] for e in cfg["oom_events"]] == [2]


# --- NaN ----------------------------------------------------------------------------------------
def test_nan_stops_before_the_optimizer_step_and_saves_nothing_at_or_after_it(tmp_path):
    rd = tmp_path / "run"
    p = run_trainer(rd, *BASE_ARGS, "--max-steps", "20", "--save-interval", "3", "--lr", "0.002",
                    "--inject-fault", "nan@step=7")
    assert p.returncode == protocol.EXIT_FAILURE_REPORTED, p.stderr
    f = failure(rd)
    assert (f["class"], f["step"]) == ("nan", 7)
    assert f["last_good_checkpoint"] == "checkpoints/step-00000006"
    assert 0 < f["lr"] <= 0.002
    assert committed(rd) == ["step-00000003", "step-00000006"]
    assert all(protocol.checkpoint_step(p) < 7 for p in (rd / "checkpoints").iterdir()
               if protocol.checkpoint_step(p) is not None)
    # What the NaN policy does next: roll back, lower LR, skip batches. The fault fired once.
    p = run_trainer(rd, *BASE_ARGS, "--max-steps", "20", "--save-interval", "3", "--lr", "0.001",
                    "--inject-fault", "nan@step=7", "--resume", f["last_good_checkpoint"],
                    "--skip-batches", "2", attempt=2)
    assert p.returncode == 0, p.stderr
    assert run_config(rd)["resumed_from_step"] == 6


def test_real_divergence_takes_the_same_nan_path(tmp_path):
    """Not injected: an absurd LR blows the weights up; the guard fires before a non-finite update."""
    rd = tmp_path / "run"
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "30", "--lr", "1e30", "--warmup-steps", "0") == 3
    f = failure(rd)
    assert f["class"] == "nan" and 1 <= f["step"] <= 30
    last = CheckpointManager(rd).latest_verified()
    if last is not None:  # whatever was saved before the bad step holds finite weights
        assert last[0] < f["step"]


# --- disk full (injected; the real tmpfs case is in test_disk_full.py) -------------------------
def test_injected_enospc_keeps_previous_checkpoint_and_leaves_no_tmp(tmp_path):
    rd = tmp_path / "run"
    args = (*BASE_ARGS, "--max-steps", "20", "--save-interval", "5", "--keep-last-k", "1")
    p = run_trainer(rd, *args, "--inject-fault", "enospc@step=10")
    assert p.returncode == protocol.EXIT_FAILURE_REPORTED, p.stderr
    f = failure(rd)
    assert (f["class"], f["step"]) == ("enospc", 10)
    assert f["bytes_needed"] > 1_000_000
    assert committed(rd) == ["step-00000005"]
    assert protocol.verify_checkpoint(rd / "checkpoints" / "step-00000005") is None
    state = CheckpointManager.load(rd / "checkpoints" / "step-00000005")
    TinyGPT(PRESETS["tiny"]).load_state_dict(state["model.pt"])
    assert tmp_entries(rd) == []
    assert not (rd / protocol.DONE_MARKER).exists()
    p = run_trainer(rd, *args, "--inject-fault", "enospc@step=10", attempt=2)
    assert p.returncode == 0, p.stderr
    assert run_config(rd)["resumed_from_step"] == 5


def test_injected_enospc_in_a_blocking_save_is_reported_at_once(tmp_path):
    rd = tmp_path / "run"
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "20", "--no-background-save",
                      "--inject-fault", "enospc@step=7") == 3
    f = failure(rd)
    assert (f["class"], f["step"]) == ("enospc", 8)  # the first save at a step >= 7
    assert committed(rd) == ["step-00000004"] and tmp_entries(rd) == []
    assert progress_step(rd) == 8


# --- crash / hang -------------------------------------------------------------------------------
def test_injected_crash_fires_once_and_the_rerun_finishes(tmp_path):
    rd = tmp_path / "run"
    args = (*BASE_ARGS, "--max-steps", "10", "--inject-fault", "crash@step=6")
    p = run_trainer(rd, *args)
    assert p.returncode == 1
    assert "RuntimeError: injected crash (crash@step=6)" in p.stderr
    f = failure(rd)
    assert (f["class"], f["step"]) == ("crash", 5)
    fired = json.loads((rd / protocol.FAULTS_FIRED).read_text())["fired"]
    assert fired["crash@step=6"]["attempt"] == 1
    p = run_trainer(rd, *args, attempt=2)
    assert p.returncode == 0, p.stderr
    assert "injecting fault" not in p.stderr
    assert protocol.verify_done_marker(rd).verified


def test_injected_hang_stops_progress_and_heartbeat(tmp_path):
    rd = tmp_path / "run"
    proc = spawn_trainer(rd, *BASE_ARGS, "--max-steps", "50", "--inject-fault", "hang@step=4")
    try:
        wait_for(lambda: (rd / protocol.FAULTS_FIRED).exists(), what="the hang to fire")
        time.sleep(0.5)
        first = protocol.read_progress(rd, 1)
        time.sleep(1.0)  # 10 heartbeat intervals
        assert proc.poll() is None, "a hang must not exit"
        assert protocol.read_progress(rd, 1) == first
        assert first["step"] == 3
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()


# --- refusals found on the filesystem / after loading --------------------------------------------
def _preempted_run(rd, *extra: str) -> None:
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "12", *extra, stop_at=(6, 1)) == protocol.EXIT_PREEMPTED


def test_resume_with_another_effective_batch_is_refused_unless_allowed(tmp_path):
    rd = tmp_path / "run"
    _preempted_run(rd)
    before = committed(rd)
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "12", "--batch-size", "16", attempt=2) == 3
    f = failure(rd, 2)
    assert f["class"] == "invalid" and "--allow-batch-change" in f["detail"]
    assert committed(rd) == before
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "12", "--batch-size", "16", "--allow-batch-change",
                      attempt=3) == 0


def test_resume_on_other_data_is_refused_unless_allowed(tmp_path):
    rd = tmp_path / "run"
    _preempted_run(rd)
    from orch_trainer.data import generated_corpus
    other = tmp_path / "other.txt"
    other.write_bytes(generated_corpus(seed=99))
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "12", "--data", str(other), attempt=2) == 3
    f = failure(rd, 2)
    assert f["class"] == "invalid" and "--allow-data-change" in f["detail"]
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "12", "--data", str(other), "--allow-data-change",
                      attempt=3) == 0
    assert run_config(rd)["data_sha256"] != ""


def test_a_missing_corpus_is_input_missing_and_an_unreadable_one_invalid_before_the_model_loads(tmp_path):
    # Missing may be an NFS hiccup (orch retries it); a directory given as --data never reads.
    rd = tmp_path / "run"
    assert run_inproc(rd, *BASE_ARGS, "--data", str(tmp_path / "missing.txt")) == 3
    f = failure(rd)
    assert f["class"] == "input_missing" and str(tmp_path / "missing.txt") in f["detail"]
    assert f["path"] == str(tmp_path / "missing.txt")
    assert not (rd / "run_config.json").exists()
    rd2 = tmp_path / "run2"
    assert run_inproc(rd2, *BASE_ARGS, "--data", str(tmp_path)) == 3
    f = failure(rd2)
    assert f["class"] == "invalid" and "unreadable" in f["detail"]
    assert not (rd2 / "run_config.json").exists()


def test_a_rollback_target_that_no_longer_verifies_falls_back_to_an_older_one_never_a_newer_one(tmp_path):
    # A NaN rollback target bit-flipped after orch's policy chose it was refused (invalid): the job
    # failed for good. Now it is set aside and the next OLDER verified checkpoint is resumed.
    rd = tmp_path / "run"
    assert run_inproc(rd, *BASE_ARGS, "--keep-last-k", "4", "--max-steps", "12", stop_at=(11, 1)) == \
        protocol.EXIT_PREEMPTED
    assert [p.name for p in protocol.iter_checkpoint_dirs(rd)] == ["step-00000010", "step-00000008", "step-00000004"]
    target = rd / "checkpoints" / "step-00000008"
    biggest = max((p for p in target.iterdir() if p.name != "manifest.json"), key=lambda p: p.stat().st_size)
    data = bytearray(biggest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the sha256 can tell
    biggest.write_bytes(bytes(data))
    assert run_inproc(rd, *BASE_ARGS, "--keep-last-k", "4", "--max-steps", "12",
                      "--resume", "checkpoints/step-00000008", attempt=2) == 0
    assert run_config(rd)["resumed_from_step"] == 4  # not 10: a rollback never resumes past the bad step
    aside = sorted(p.name.split("-")[1] for p in (rd / "checkpoints").iterdir() if "." in p.name)
    assert aside == ["00000008.corrupt", "00000010.abandoned"], sorted(os.listdir(rd / "checkpoints"))
    assert protocol.verify_done_marker(rd).verified


def test_checkpoint_of_another_model_shape_is_refused_before_the_first_step(tmp_path):
    rd = tmp_path / "run"
    _preempted_run(rd)
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "12", "--lora-rank", "2", attempt=2) == 3
    f = failure(rd, 2)
    assert f["class"] == "invalid" and "does not fit this model" in f["detail"]


def test_corrupt_newest_checkpoint_is_skipped_reported_and_resume_stays_exact(tmp_path, baseline):
    rd = tmp_path / "run"
    args = (*BASE_ARGS, "--max-steps", "12")
    _preempted_run(rd)
    assert committed(rd) == ["step-00000004", "step-00000005"]
    blob = rd / "checkpoints" / "step-00000005" / "model.pt"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit-pattern: same size, different hash
    blob.write_bytes(bytes(data))
    assert run_inproc(rd, *args, attempt=2) == 0
    cfg = run_config(rd)
    assert cfg["resumed_from_step"] == 4
    assert [s["name"] for s in cfg["skipped_checkpoints"]] == ["step-00000005"]
    assert "sha256 mismatch" in cfg["skipped_checkpoints"][0]["reason"]
    assert any(p.name.startswith("step-00000005.corrupt-") for p in (rd / "checkpoints").iterdir())
    assert_bit_identical(result_state(rd), baseline(*args))


def test_stale_tmp_dirs_are_removed_and_stale_failure_set_aside(tmp_path):
    rd = tmp_path / "run"
    _preempted_run(rd)
    stale = rd / "checkpoints" / f"step-00000099{protocol.TMP_INFIX}dead"
    stale.mkdir()
    (stale / "model.pt").write_bytes(b"half")
    # Same attempt again (Slurm in-place requeue): the old failure.json must not read as this run's.
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "12") == 0
    assert tmp_entries(rd) == []
    adir = protocol.attempt_dir(rd, 1)
    assert not (adir / protocol.FAILURE_FILE).exists()
    assert json.loads((adir / "failure.prev-1.json").read_text())["class"] == "preempted"


def test_fork_checkpoint_is_listed_in_done_json_and_another_run_resumes_from_it(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    assert run_inproc(src, *BASE_ARGS, "--max-steps", "6", "--save-fork-checkpoint") == 0
    marker = protocol.verify_done_marker(src)
    assert marker.verified
    fork = src / "result" / "checkpoints" / "step-00000006"
    assert f"result/checkpoints/step-00000006/{protocol.MANIFEST}" in marker.marker["artifacts"]
    assert "result/checkpoints/step-00000006/optim.pt" in marker.marker["artifacts"]
    assert run_inproc(dst, *BASE_ARGS, "--max-steps", "8", "--resume", str(fork)) == 0
    assert run_config(dst)["resumed_from_step"] == 6


def test_fork_with_lora_is_refused_again_before_the_fork_is_written(tmp_path):
    """The late backstop: a script that builds the args itself skips argparse's refusal."""
    from orch_trainer.config import parse_args
    from orch_trainer.loop import Trainer
    from orchestrator.kit.preemption import PreemptionFlag
    rd = tmp_path / "run"
    args = parse_args(["--run-dir", str(rd), *BASE_ARGS, "--max-steps", "2", "--lora-rank", "2"])
    args.save_fork_checkpoint = True
    protocol.attempt_dir(rd, 1).mkdir(parents=True)
    assert Trainer(args, rd, 1, "run", PreemptionFlag()).run() == protocol.EXIT_FAILURE_REPORTED
    f = failure(rd)
    assert f["class"] == "invalid"
    assert "--save-fork-checkpoint" in f["detail"] and "--lora-rank" in f["detail"]
    assert not (rd / "result" / "checkpoints").exists() and not (rd / protocol.DONE_MARKER).exists()


def test_lora_trains_only_adapters_and_result_loads_into_the_plain_model(tmp_path):
    rd = tmp_path / "run"
    assert run_inproc(rd, *BASE_ARGS, "--max-steps", "4", "--lora-rank", "2") == 0
    TinyGPT(PRESETS["tiny"]).load_state_dict(result_state(rd))  # merged: the plain architecture
