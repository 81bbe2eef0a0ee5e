"""OrchCallback for Lightning (examples/lightning_train.py), on the local backend through the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from intkit import (
    DONE,
    PY,
    example,
    failure,
    quiet_env,
    rank_pid,
    rank_step_log,
    run_direct,
    state_dicts_equal,
    step_log,
)
from orchkit import wait_for

from orchestrator import protocol

MAX = 120


def _weights(path) -> dict:
    return torch.load(path, weights_only=False)["state_dict"]


def test_one_eio_in_a_lightning_checkpoint_write_is_storage_retried_uncounted_and_verified(orch):
    """Only the bundled trainer knew the class storage; an EIO in Lightning's own checkpoint write was a
    counted crash (with --max-attempts 1, a failed job). The callback's on_exception now says storage."""
    orch.write_config("[policy]\ncrash_backoff_s = 0.2\n")
    script = str(Path(__file__).parent / "scripts" / "lightning_eio.py")
    orch("submit", "--name", "leio", "--max-attempts", "1", "--", sys.executable, script, "--max-steps", "30",
         "--save-every", "10", env={"EIO_STEP": "20"}, check=True)
    assert orch.wait("leio", {DONE, "failed", "cancelled"}, timeout=240) == DONE, orch.show("leio")
    shown = orch.show("leio")["attempts"]
    assert [(a["state"], a["failure_class"]) for a in shown] == [("failed", "storage"), ("succeeded", None)], shown
    assert failure(orch.runs / "leio", 1)["step"] == 20
    assert protocol.read_progress(orch.runs / "leio", 2)["resumed_from"] == 10  # step 10's checkpoint: intact


def test_a_stop_at_a_step_that_validation_follows_resumes_bit_exact(tmp_path):
    """SIGTERM during step 10 with validation every 10 steps (no orch: ``--run-dir``). The uninterrupted run's
    validation draws from the global RNG (the val loader seeds its iterator) before step 11's dropout; a stop
    saved at step 10's batch end missed that draw and the resumed weights differed (CI, stop 17). The stop
    is taken when the validation starts; the resumed run ends bit-equal to the uninterrupted one."""
    args = ["--max-steps", "20", "--val-every", "10"]
    run_dir, log = tmp_path / "run", tmp_path / "steps.log"
    run_dir.mkdir()
    # 0.1 s a step: the signal, sent once step 9 is logged, lands inside step 10's training_step.
    p = subprocess.Popen(example("lightning_train.py", *args, "--sleep-per-step", "0.1", "--step-log", str(log),
                                 "--run-dir", str(run_dir)), cwd=run_dir, env=quiet_env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: log.exists() and 9 in [s for _, s in step_log(log)], 120, "step 9 in the step log")
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=120) == 143, p.stderr.read()
    finally:
        p.kill()
    assert failure(run_dir, 1)["step"] == 10, failure(run_dir, 1)
    resumed = subprocess.run(example("lightning_train.py", *args, "--step-log", str(log), "--run-dir", str(run_dir)),
                             cwd=run_dir, env=quiet_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [s for _, s in step_log(log)] == list(range(1, 21))
    run_direct(example("lightning_train.py", *args), tmp_path / "ref")
    assert state_dicts_equal(_weights(run_dir / "result" / "model.ckpt"),
                             _weights(tmp_path / "ref" / "result" / "model.ckpt"))


def _ddp_rank_past_step_10(orch, rank: int, max_steps: int, past: int = 10) -> tuple[Path, Path, int]:
    """Submit the Lightning example as the DDP job "ddp" on two ranks; (run dir, step log, the pid of ``rank``)
    once that rank is past step ``past``."""
    log = orch.home.parent / "ddp-steps.log"
    orch("submit", "--name", "ddp", "--nproc-per-node", "2", "--", *example(
        "lightning_train.py", "--max-steps", str(max_steps), "--sleep-per-step", "0.1", "--step-log", str(log)),
        env={"OMP_NUM_THREADS": "1"}, check=True)
    run_dir = orch.runs / "ddp"

    def past_step_10() -> int | None:
        return rank_pid(run_dir, rank, "lightning_train.py") \
            if any(r == rank and s > past for _a, r, s in rank_step_log(log)) else None

    return run_dir, log, wait_for(past_step_10, 180, f"rank {rank} past step {past}", interval=0.02)


def test_lightning_ddp_on_two_ranks_a_signal_to_one_rank_stops_both_after_one_step_and_resumes_bit_exact(orch,
                                                                                                          tmp_path):
    """`orch submit --nproc-per-node 2` runs the unchanged Lightning script as DDP over two ranks; SIGTERM to rank
    1 alone (the kit's stop agreement): both ranks end attempt 1 after the same step, the one
    checkpointed, and attempt 2 (requeued by reconcile alone) starts right after it on both. Stopped in epoch 1
    (43 batches per rank and epoch), the resumed run ends bit-equal to an uninterrupted 2-rank run (it
    saw other batches: Lightning's wrapped sampler drew its order from the global RNG, and a DistributedSampler
    resumed in epoch 1 replayed epoch 0's order)."""
    run_dir, log, pid = _ddp_rank_past_step_10(orch, 1, max_steps=60, past=45)
    os.kill(pid, signal.SIGTERM)
    assert orch.wait("ddp", {DONE, "failed", "cancelled"}, timeout=240) == DONE, orch.show("ddp")
    shown = orch.show("ddp")["attempts"]
    assert [(a["failure_class"], (a["action"] or {}).get("auto")) for a in shown] == [("preempted", True),
                                                                                     (None, None)], shown
    stop = failure(run_dir, 1)["step"]
    done = rank_step_log(log)
    assert {max(s for a, r, s in done if a == 1 and r == rank) for rank in (0, 1)} == {stop}, done
    assert {min(s for a, r, s in done if a == 2 and r == rank) for rank in (0, 1)} == {stop + 1}, done
    assert sorted(s for a, r, s in done if r == 0) == list(range(1, 61))  # no step twice, none skipped
    # Every rank beat (the hang policy judges the oldest): rank 1 its own file, up to where it stopped; rank 0
    # progress.json, naming the world size.
    rank1 = protocol.read_step(protocol.attempt_dir(run_dir, 1) / protocol.RANK_PROGRESS.format(1))
    assert rank1 is not None and 10 < rank1 <= stop, (rank1, stop)
    assert protocol.read_progress(run_dir, 1)["world_size"] == 2
    assert orch("verify", "ddp").stdout == "VERIFIED\n"
    ref = tmp_path / "ref"
    run_direct([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                *example("lightning_train.py", "--max-steps", "60")[1:]], ref)
    assert state_dicts_equal(_weights(run_dir / "result" / "model.ckpt"), _weights(ref / "result" / "model.ckpt"))


def test_lightning_ddp_rank_0_killed_is_classed_killed_requeued_and_resumes(orch):
    """A kill -9 of rank 0 of a Lightning DDP job was classed ``preempted`` from the stop record its surviving
    peer wrote after it, so the death never counted towards the mean time between unwarned failures. A rank that
    died of a kill is ``killed``, whatever its peers recorded after it: auto-requeued, and attempt 2 resumes."""
    _run_dir, log, pid = _ddp_rank_past_step_10(orch, 0, max_steps=40)
    os.kill(pid, signal.SIGKILL)
    assert orch.wait("ddp", {DONE, "failed", "cancelled"}, timeout=300) == DONE, orch.show("ddp")
    shown = orch.show("ddp")["attempts"]
    assert [(a["failure_class"], (a["action"] or {}).get("auto")) for a in shown] == [("killed", True),
                                                                                     (None, None)], shown
    done = rank_step_log(log)
    assert sorted({s for a, r, s in done if r == 0}) == list(range(1, 41)), done  # resumed, nothing skipped
    assert orch("verify", "ddp").stdout == "VERIFIED\n"
