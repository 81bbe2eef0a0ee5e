"""kill -9 at random moments, many times, during a run that saves every step.

Claim: a reader never sees a committed checkpoint that fails to verify, the newest verified one
always loads, and the newest verified step never goes backwards (the previous one is never lost).
Each trial forks this process (torch already imported, so a trial costs ~0.3 s instead of ~2 s)
and the child runs the real trainer entry point; the parent sends a real SIGKILL.
"""

from __future__ import annotations

import os
import random
import signal
import time

from trainerkit import BASE_ARGS, committed, run_inproc, tmp_entries

from orch_trainer.model import PRESETS, TinyGPT
from orchestrator import protocol
from orchestrator.kit.checkpoint import CheckpointManager

TRIALS = 40


def _run_child(rd, args, attempt) -> None:  # pragma: no cover - runs in the forked child
    code = 1
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        code = run_inproc(rd, *args, attempt=attempt)
    finally:
        os._exit(code)


def test_kill_9_never_leaves_a_bad_newest_checkpoint_nor_loses_the_previous(tmp_path):
    rd = tmp_path / "run"
    args = (*BASE_ARGS, "--max-steps", "100000", "--save-interval", "1", "--keep-last-k", "2")
    rng = random.Random(20261129)
    # Warm up this process (imports, first-call kernel set-up) so every forked child starts training fast.
    assert run_inproc(tmp_path / "warm-up", *BASE_ARGS, "--max-steps", "1") == 0
    newest_step, during_save, model = -1, 0, TinyGPT(PRESETS["tiny"])
    for trial in range(1, TRIALS + 1):
        pid = os.fork()
        if pid == 0:  # pragma: no cover
            _run_child(rd, args, trial)
        time.sleep(rng.uniform(0.05, 0.5))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        assert killed, f"trial {trial}: the child exited before the kill"
        during_save += bool(tmp_entries(rd))
        names = committed(rd)
        for name in names:  # a committed name is a verified checkpoint, always
            assert protocol.verify_checkpoint(rd / "checkpoints" / name) is None, f"trial {trial}: {name}"
        if not names:
            assert newest_step < 0, f"trial {trial}: every checkpoint is gone (newest was {newest_step})"
            continue
        newest = rd / "checkpoints" / names[-1]
        state = CheckpointManager.load(newest)  # verifies AND unpickles
        model.load_state_dict(state["model.pt"])
        assert state["meta.json"]["step"] == protocol.checkpoint_step(newest)
        assert protocol.checkpoint_step(newest) >= newest_step, f"trial {trial}: newest went backwards"
        newest_step = protocol.checkpoint_step(newest)
    print(f"{TRIALS} kills: {during_save} inside a save, newest verified step {newest_step}")
    assert newest_step > 0
    assert during_save > 0, "no kill landed inside a save: the test did not exercise the window"
    # The next clean start removes what the kills left half-written and finishes from the newest.
    final = (*BASE_ARGS, "--max-steps", str(newest_step + 2), "--save-interval", "1", "--keep-last-k", "2")
    assert run_inproc(rd, *final, attempt=TRIALS + 1) == 0
    assert tmp_entries(rd) == []
    assert protocol.verify_done_marker(rd).verified
