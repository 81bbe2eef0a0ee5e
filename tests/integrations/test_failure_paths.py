"""What an integration must survive besides a clean SIGTERM: a kill -9 mid-save, a program that exits 0
after a signal, a user's own file under checkpoints/. Local backend, real CLI, real frameworks."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from intkit import DONE, ROOT, program_pids, repeats, step_log
from orchkit import wait_for
from transformers.trainer_utils import get_last_checkpoint

from orchestrator import protocol

SCRIPTS = ROOT / "tests" / "integrations" / "scripts"


def test_one_eio_in_hfs_own_checkpoint_write_is_storage_retried_uncounted_and_verified(orch):
    """An EIO in HF's own save left train() as a plain exception, a counted crash (with --max-attempts
    1, a failed job). The callback's excepthook records it as storage: retried, never counted, resumed from the
    checkpoint before it."""
    orch.write_config("[policy]\ncrash_backoff_s = 0.2\n")
    orch("submit", "--name", "hfeio", "--max-attempts", "1", "--", sys.executable, str(SCRIPTS / "hf_eio.py"),
         "--max-steps", "30", "--save-steps", "10", check=True)
    assert orch.wait("hfeio", {DONE, "failed", "cancelled"}, timeout=240) == DONE, orch.show("hfeio")
    shown = orch.show("hfeio")["attempts"]
    assert [(a["state"], a["failure_class"]) for a in shown] == [("failed", "storage"), ("succeeded", None)], shown
    assert "injected: EIO writing" in protocol.read_failure(orch.runs / "hfeio", 1)["detail"]
    assert protocol.read_progress(orch.runs / "hfeio", 2)["resumed_from"] == 10


def test_hf_killed_mid_save_is_requeued_and_resumes_from_the_last_complete_checkpoint(orch, tmp_path):
    log = tmp_path / "steps.log"
    orch("submit", "--name", "hfkill", "--", sys.executable, str(SCRIPTS / "hf_kill_mid_save.py"),
         "--max-steps", "60", "--save-steps", "10", "--step-log", str(log), check=True)
    run_dir = orch.runs / "hfkill"
    wait_for(lambda: (run_dir / "in-save").exists(), 180, "the third checkpoint save to start")
    (pid,) = program_pids(run_dir, "hf_kill_mid_save.py")
    os.kill(pid, signal.SIGKILL)
    assert orch.wait("hfkill", {"retryable_failed", DONE}, timeout=60) == "retryable_failed"
    assert orch.show("hfkill")["attempts"][0]["failure_class"] == "killed"

    # What the kill left: HF's own pick (resume_from_checkpoint=True) would be the torn checkpoint-30,
    # whose optimizer.pt holds half its bytes: every requeue would crash on it. orch's are 10 and 20.
    torn = get_last_checkpoint(str(run_dir / "hf-output"))
    assert torn is not None and torn.endswith("checkpoint-30"), torn
    assert [s for s, _ in protocol.verified_checkpoints(run_dir)] == [20, 10]

    p = orch("requeue", "hfkill")
    assert p.returncode == 0, p.stdout + p.stderr
    assert orch.wait("hfkill", {DONE, "retryable_failed", "failed"}, timeout=180) == DONE, orch.show("hfkill")
    steps = step_log(log)
    assert min(s for a, s in steps if a == 2) == 21  # resumed from step-20, the last complete one
    assert sorted({s for _, s in steps}) == list(range(1, 61))
    assert repeats(steps) <= 10  # steps 21..30 (the save of 30 never completed): the price of no signal
    # Set aside by orch's launch of attempt 2 (a torn checkpoint of a known layout), before the
    # callback's own check (which would name it .incomplete-) ran.
    assert list((run_dir / "hf-output").glob("checkpoint-30.torn-*")), list((run_dir / "hf-output").iterdir())
    assert orch.show("hfkill")["attempts"][1]["set_aside"][0]["path"] == "hf-output/checkpoint-30"
    assert (run_dir / "in-save").exists() and orch("verify", "hfkill").returncode == 0


def test_program_that_exits_0_after_sigterm_is_never_verified(orch):
    # Lightning without orch's callback: SIGTERM -> its SIGTERMException -> exit 0, after ModelCheckpoint
    # wrote result/*.ckpt. With --outputs the wrapper must still not write done.json: it delivered a
    # termination signal to this attempt (contract additions 2026-12). The SIGTERM goes where a
    # preemption notice goes: to the job's batch process, orch's wrapper (Slurm also signals every
    # process of the job; tests/slurm covers that).
    orch("submit", "--name", "exit0", "--outputs", "result/*", "--", sys.executable,
         str(SCRIPTS / "lightning_without_callback.py"), "400", check=True)
    run_dir = orch.runs / "exit0"
    wait_for(lambda: list((run_dir / "result").glob("*.ckpt")), 180, "a ModelCheckpoint file")
    (pid,) = program_pids(run_dir, "lightning_without_callback.py")
    wrapper = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
    assert b"orchestrator.jobside.wrapper" in Path(f"/proc/{wrapper}/cmdline").read_bytes()
    os.kill(wrapper, signal.SIGTERM)
    exit_json = protocol.attempt_dir(run_dir, 1) / protocol.EXIT_FILE
    wait_for(exit_json.exists, 60, "attempt 1 to exit")
    try:
        assert protocol.read_json_bounded(exit_json)["returncode"] == 0  # Lightning's own behaviour, measured
        orch("reconcile", check=True)
        first = orch.show("exit0")["attempts"][0]
        assert orch.state("exit0") != DONE and not protocol.verify_done_marker(run_dir).verified, first
        assert first["failure_class"] == "preempted", first
    finally:
        orch("cancel", "exit0")


USER_CKPT = """
import os, pathlib, sys
ckpt = pathlib.Path("checkpoints/ckpt.pt")
if not ckpt.exists():
    ckpt.parent.mkdir(exist_ok=True)
    ckpt.write_text("step 500")          # the user's own checkpoint format
    sys.exit(1)                           # then a crash
pathlib.Path("result").mkdir(exist_ok=True)
pathlib.Path("result/out.txt").write_text("resumed from " + ckpt.read_text())
"""


def test_users_own_file_under_checkpoints_survives_requeue(orch):
    # orch owns only step-<8 digits> dirs under checkpoints/ (contract additions 2026-12). Needs the core change.
    orch("submit", "--name", "userckpt", "--outputs", "result/*", "--", sys.executable, "-c", USER_CKPT, check=True)
    assert orch.wait("userckpt", {"retryable_failed", DONE}, timeout=60) == "retryable_failed"
    run_dir = orch.runs / "userckpt"
    assert (run_dir / "checkpoints" / "ckpt.pt").read_text() == "step 500"
    p = orch("requeue", "userckpt")
    assert p.returncode == 0, p.stdout + p.stderr
    trashed = list((orch.home / "trash").rglob("ckpt.pt"))
    assert not trashed, f"orch requeue moved the user's checkpoint to the trash: {trashed}"
    assert orch.wait("userckpt", {DONE, "retryable_failed"}, timeout=60) == DONE
    assert (run_dir / "result" / "out.txt").read_text() == "resumed from step 500"
