"""One test per failure class: a real trainer job on the local backend, a fault injected at the real
code site, the class orch derives, the action its policy takes, and the job ending verified.

These are the runbook's recovery procedures (seed 002) done by policy instead of by hand.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from orchkit import wait_for

from orchestrator import protocol

TRAINER = [sys.executable, "-m", "orch_trainer", "--preset", "tiny"]
DONE = {"done_marker_verified"}
SETTLED = {"done_marker_verified", "failed", "retryable_failed", "cancelled"}


def submit(orch, name: str, *trainer_args: str, opts: tuple[str, ...] = ()) -> None:
    orch("submit", "--name", name, *opts, "--", *TRAINER, *trainer_args, check=True)


def attempts(orch, name: str) -> list[dict]:
    return orch.show(name)["attempts"]


def argv_of(orch, name: str, n: int) -> list[str]:
    run_dir = Path(orch.show(name)["run_dir"])
    return json.loads((protocol.attempt_dir(run_dir, n) / protocol.COMMAND_FILE).read_text())["argv"]


def overrides_of(orch, name: str, n: int) -> dict:
    """ORCH_OVERRIDES as orch launched attempt n with it (command.json, written before the launch)."""
    run_dir = Path(orch.show(name)["run_dir"])
    return json.loads((protocol.attempt_dir(run_dir, n) / protocol.COMMAND_FILE).read_text())["overrides"]


def test_nan_rolls_back_halves_lr_skips_batches_and_quarantines(orch):
    # Roll back at least 6 steps: the newest checkpoint before the NaN at 25 (step 20) is too close,
    # so the retry resumes from 15 and step 20 is quarantined (moved to the trash, not deleted).
    orch.write_config("[policy]\nnan_rollback_steps = 6\n")
    submit(orch, "nan", "--max-steps", "40", "--save-interval", "5", "--lr", "0.002",
           "--inject-fault", "nan@step=25")
    assert orch.wait("nan", DONE, timeout=180) == "done_marker_verified"
    a1, a2 = attempts(orch, "nan")[:2]
    assert (a1["failure_class"], a1["failure_step"]) == ("nan", 25)
    act = a1["action"]
    assert act["action"] == "rollback" and act["details"]["resume_step"] == 15
    assert act["overrides"]["lr"] == pytest.approx(0.001) and act["details"]["lr_before"] == pytest.approx(0.002)
    assert act["quarantine"] == ["checkpoints/step-00000020"]
    # The policy reaches the bundled trainer in ORCH_OVERRIDES, as it reaches any program; its argv is the
    # user's, unchanged (no program is recognised from argv).
    assert argv_of(orch, "nan", 2) == argv_of(orch, "nan", 1)
    given = overrides_of(orch, "nan", 2)
    assert given["lr"] == pytest.approx(0.001) and given["resume"].endswith("checkpoints/step-00000015")
    assert given["skip_batches"] == 25 - 15
    assert list((orch.home / "trash" / "nan").glob("*/checkpoints/step-00000020"))
    cfg = json.loads((orch.runs / "nan" / protocol.RUN_CONFIG).read_text())
    assert cfg["resumed_from_step"] == 15 and cfg["lr"] == pytest.approx(0.001)


def test_oom_in_process_halves_micro_batch_and_keeps_effective_batch(orch):
    submit(orch, "oom1", "--max-steps", "20", "--batch-size", "8", "--micro-batch-size", "4",
           "--inject-fault", "oom@step=5")
    assert orch.wait("oom1", DONE, timeout=120) == "done_marker_verified"
    assert len(attempts(orch, "oom1")) == 1  # recovered without the orchestrator
    cfg = json.loads((orch.runs / "oom1" / protocol.RUN_CONFIG).read_text())
    assert (cfg["micro_batch_size"], cfg["batch_size"]) == (2, 8)


def test_oom_at_micro_batch_one_asks_for_more_memory(orch):
    submit(orch, "oom2", "--max-steps", "20", "--batch-size", "2", "--micro-batch-size", "1",
           "--save-interval", "4", "--inject-fault", "oom@step=6", opts=("--mem", "1G"))
    assert orch.wait("oom2", DONE, timeout=150) == "done_marker_verified"
    a1 = attempts(orch, "oom2")[0]
    assert a1["failure_class"] == "oom"
    act = a1["action"]
    assert (act["action"], act["details"]["mem_mb_before"], act["resources"]["mem_mb"]) == ("more_memory", 1024, 2048)
    assert orch.show("oom2")["resources"]["mem_mb"] == 2048


def test_enospc_prunes_old_checkpoints_empties_trash_and_resumes(orch):
    orch.write_config("[policy]\nkeep_last_k = 1\n")
    submit(orch, "disk", "--max-steps", "30", "--save-interval", "4", "--keep-last-k", "10",
           "--inject-fault", "enospc@step=20")
    assert orch.wait("disk", DONE, timeout=180) == "done_marker_verified"
    a1 = attempts(orch, "disk")[0]
    assert a1["failure_class"] == "enospc"
    assert a1["action"]["action"] == "prune_and_resume"
    pruned = a1["action"]["prune"]
    assert pruned and all(not (orch.runs / "disk" / p).exists() for p in pruned)
    assert not any(p.is_file() for p in (orch.home / "trash").rglob("*")), "the trash was emptied"


def test_an_io_error_while_a_checkpoint_is_written_is_a_storage_fault_retried_uncounted(orch):
    """One EIO inside the checkpoint writer's write(), the previous checkpoint intact, was a counted
    crash: `failed` under --max-attempts 1. Now: class storage, uncounted, requeued after a back-off by the
    reconciler alone, resumed from the previous checkpoint, verified."""
    orch.write_config("[policy]\ncrash_backoff_s = 0.2\n")
    submit(orch, "eio", "--max-steps", "30", "--save-interval", "4", "--inject-fault", "eio@step=20",
           opts=("--max-attempts", "1"))
    assert orch.wait("eio", DONE, timeout=180) == "done_marker_verified"
    a1, a2 = attempts(orch, "eio")
    assert (a1["failure_class"], a1["counted"], a1["action"]["auto"]) == ("storage", False, True), a1
    assert "Input/output error" in a1["detail"] and "previous checkpoints are intact" in a1["detail"], a1
    assert a1["action"]["details"]["backoff_s"] == 0.2, a1["action"]
    assert json.loads((orch.runs / "eio" / protocol.RUN_CONFIG).read_text())["resumed_from_step"] == 16
    # Each attempt's step in `orch show`: where it failed, and where the succeeded one ended (was step=-).
    text = orch("show", "eio", check=True).stdout
    assert re.search(r"attempt 1: failed .*class=storage +step=20 ", text), text
    assert re.search(r"attempt 2: succeeded .*class=- +step=30 ", text), text


def test_preemption_resumes_and_is_not_counted(orch):
    submit(orch, "pre", "--max-steps", "30", "--save-interval", "100", "--inject-fault", "sigterm@step=12",
           opts=("--max-attempts", "1"))
    assert orch.wait("pre", DONE, timeout=150) == "done_marker_verified"
    a1, a2 = attempts(orch, "pre")
    assert a1["failure_class"] == "preempted" and a1["counted"] is False
    cfg = json.loads((orch.runs / "pre" / protocol.RUN_CONFIG).read_text())
    # SIGTERM during step 12: the checkpoint holds the last completed step (11), not a periodic one
    # (interval 100) -- at most one optimizer step lost.
    assert cfg["resumed_from_step"] == 11


def test_hang_is_stopped_and_resumed(orch):
    orch.write_config("[policy]\nhang_timeout_s = 4\n")
    submit(orch, "hang", "--max-steps", "30", "--save-interval", "5", "--inject-fault", "hang@step=12")
    assert orch.wait("hang", DONE, timeout=180) == "done_marker_verified"
    a1 = attempts(orch, "hang")[0]
    assert a1["failure_class"] == "hang" and a1["action"]["action"] == "resume"


def test_crash_waits_for_requeue_then_resumes(orch):
    submit(orch, "crash", "--max-steps", "30", "--save-interval", "5", "--inject-fault", "crash@step=12")
    assert orch.wait("crash", SETTLED, timeout=120) == "retryable_failed"
    assert attempts(orch, "crash")[0]["failure_class"] == "crash"
    p = orch("requeue", "--failed", check=True)
    assert "crash: requeued as attempt 2" in p.stdout
    assert orch.wait("crash", DONE, timeout=120) == "done_marker_verified"
    cfg = json.loads((orch.runs / "crash" / protocol.RUN_CONFIG).read_text())
    assert cfg["resumed_from_step"] == 10


def test_kill9_mid_run_recovers_from_last_checkpoint(orch):
    submit(orch, "k9", "--max-steps", "30", "--save-interval", "5", "--inject-fault", "sigkill@step=17")
    assert orch.wait("k9", SETTLED, timeout=120) == "retryable_failed"
    assert attempts(orch, "k9")[0]["failure_class"] == "killed"  # auto-requeued after a back-off
    # The step-15 save runs in the background and may not have committed when SIGKILL came at 17:
    # the retry must resume from whatever is newest AND verifies, and never from scratch.
    newest = protocol.verified_checkpoints(orch.runs / "k9")[0][0]
    assert newest in (10, 15)
    orch("requeue", "k9", check=True)
    assert orch.wait("k9", DONE, timeout=120) == "done_marker_verified"
    cfg = json.loads((orch.runs / "k9" / protocol.RUN_CONFIG).read_text())
    assert cfg["resumed_from_step"] == newest


def test_local_time_limit_checkpoints_and_resumes_as_timeout(orch):
    # --time 0:15 (longer than a busy CI machine's start-up): the wrapper sends SIGTERM at the limit like
    # Slurm; the trainer checkpoints and the next attempt resumes from there. The run is far too long to
    # finish inside the limit whatever the machine's speed: the claim is checked on attempts 1 and 2.
    submit(orch, "tl", "--max-steps", "1000000", "--save-interval", "100000", opts=("--time", "0:15"))
    run_dir = orch.runs / "tl"

    def resumed() -> tuple[list, dict] | None:  # (the attempts, run_config.json) once attempt 2 resumed
        orch("reconcile", check=True)
        att = attempts(orch, "tl")
        if len(att) < 2 or not (run_dir / "attempts" / "2" / "wrapper.json").exists():
            return None
        cfg = json.loads((run_dir / protocol.RUN_CONFIG).read_text())
        return (att, cfg) if cfg.get("resumed_from_step") is not None else None

    att, cfg = wait_for(resumed, 120, "attempt 2 to resume", interval=0.5, detail=lambda: orch.show("tl"))
    a1 = att[0]
    assert (a1["failure_class"], a1["counted"], a1["action"]["auto"]) == ("timeout", False, True), a1
    assert a1["failure_step"] > 0, "attempt 1 made progress before its limit"
    assert cfg["resumed_from_step"] == a1["failure_step"], "resumed from the checkpoint written at the limit"
    orch("cancel", "tl", check=True)


def test_time_limit_shorter_than_startup_gives_up_instead_of_looping(orch):
    # Found the hard way: a 1 s limit never gets past step 0, and free (uncounted) resumes looped forever.
    # Time limits never count; the no-progress guard (policy.no_progress_attempts, default 3) ends
    # it as no_progress once the newest checkpoint stops advancing over 3 attempts.
    submit(orch, "tl0", "--max-steps", "400", opts=("--time", "0:01", "--max-attempts", "2"))
    assert orch.wait("tl0", SETTLED - {"retryable_failed"}, timeout=120) == "failed"
    att = attempts(orch, "tl0")
    assert [a["failure_class"] for a in att] == ["timeout"] * (len(att) - 1) + ["no_progress"], att
    assert 3 <= len(att) <= 4 and not any(a["counted"] for a in att), att
    assert att[-1]["action"]["action"] == "give_up" and "no_progress" in att[-1]["action"]["why"]


def test_invalid_goes_to_failed_at_once(orch):
    orch("submit", "--name", "bad", "--", *TRAINER, "--lora-rank", "4", "--save-fork-checkpoint", check=True)
    assert orch.wait("bad", SETTLED, timeout=60) == "failed"
    a1 = attempts(orch, "bad")[0]
    assert a1["failure_class"] == "invalid" and len(attempts(orch, "bad")) == 1
    assert not list((orch.runs / "bad").glob("checkpoints/step-*"))
