"""W&B: a job that orch ends as cancelled or failed is a failed W&B run whose summary names that end; a verified one
is left as its last process finished it. With the real SDK, offline, read back from W&B's own transaction log.

Without the mark, W&B shows what the last process reported: a preempted or cancelled attempt of the plain loop
ends its run cleanly (exit code 0, "finished"), a killed one never reports ("crashed").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from intkit import example, program_pids, progress_step
from orchkit import wait_for
from wandbfiles import offline_runs

from orchestrator import protocol

pytest.importorskip("wandb")

OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def test_a_cancelled_job_is_a_failed_w_and_b_run_marked_cancelled(orch):
    orch("submit", "--name", "wb", "--", *example("plain_loop.py", "--max-steps", "100000", "--sleep-per-step", "0.05",
                                                  "--wandb"), check=True, env=OFFLINE)
    run_dir = orch.runs / "wb"

    def logging() -> bool:
        if not program_pids(run_dir, "plain_loop.py", 1):
            orch.reconcile_paced()
            return False
        return progress_step(run_dir, 1) >= 3 and protocol.wandb_record(run_dir) is not None

    wait_for(logging, 120, "the job logging to its recorded W&B run", interval=0.1)
    rec = protocol.wandb_record(run_dir)
    run_id = protocol.stable_run_id(run_dir, "wb")
    assert (rec["run_id"], rec["project"], rec["mode"], rec["root_dir"]) == (run_id, "orch-examples", "offline",
                                                                             str(run_dir)), rec
    orch("cancel", "wb", check=True)
    assert orch.wait("wb", {"cancelled"}, timeout=120) == "cancelled"

    def marked() -> list | None:
        try:
            runs = offline_runs(run_dir / "wandb")
        except ValueError:  # the mark's dir is there, its .wandb file not yet
            return None
        return runs if len(runs) == 2 and runs[-1].exit_code is not None else None

    program, mark = wait_for(marked, 60, "the W&B run marked", interval=0.2)
    assert program.run_id == mark.run_id == run_id
    assert program.exit_code != 143, program  # the program's own end said nothing of the cancel
    assert (mark.exit_code, mark.summary.get("orch/end"), mark.rows) == (143, "cancelled", []), mark
    # The child notes the end in trackers.json just after W&B finishes the run (the MLflow test's CI 74 race): wait.
    shown = wait_for(lambda: (s := orch.show("wb")["trackers"]["wandb"]).get("end") and s, 30,
                     "the W&B run's end noted in trackers.json")
    assert (shown["run_id"], shown["end"]) == (run_id, "cancelled"), shown
    assert f"W&B run: {run_id} in orch-examples (offline), marked cancelled" in orch("show", "wb", check=True).stdout


PROGRAM = """
import os, sys, wandb
from pathlib import Path
from orchestrator.kit import wandbrecord
run = wandb.init(id="killed1", project="p", dir=sys.argv[2], mode="offline")
run.log({"loss": 1.0}, step=1)
wandbrecord.note(Path(sys.argv[1]), None)
os._exit(9)  # killed: W&B never hears of the end
"""


def _finish(run_dir: Path, end: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.jobside.trackerfinish", "finish-many"],
                          input=json.dumps([[str(run_dir), end]]), capture_output=True, text=True, timeout=120,
                          env={**os.environ, **OFFLINE})


@pytest.mark.parametrize("inside", [True, False], ids=["wandb-dir-in-the-run-dir", "wandb-dir-elsewhere"])
def test_a_failed_end_is_marked_where_orch_may_write_and_a_verified_one_is_left_alone(tmp_path, inside):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    wandb_root = run_dir if inside else tmp_path / "users-own"
    wandb_root.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-c", PROGRAM, str(run_dir), str(wandb_root)], check=False, timeout=120,
                   env={**os.environ, **OFFLINE})
    assert protocol.wandb_record(run_dir)["root_dir"] == str(wandb_root)

    p = _finish(run_dir, "verified")
    assert (p.returncode, p.stdout, p.stderr) == (0, "", ""), p
    assert len(offline_runs(wandb_root / "wandb")) == 1  # nothing resumed: the last process's end stands

    p = _finish(run_dir, "failed")
    assert p.returncode == 0 and "W&B run killed1: failed (exit code 1)" in p.stdout, p
    (mark,) = offline_runs(run_dir / "wandb") if not inside else offline_runs(run_dir / "wandb")[1:]
    assert (mark.run_id, mark.exit_code, mark.summary.get("orch/end")) == ("killed1", 1, "failed"), mark
    # never outside the run dir: a W&B dir elsewhere (the user's) gets nothing, the mark lies in the run dir
    assert len(offline_runs(wandb_root / "wandb")) == (2 if inside else 1)
    assert protocol.wandb_record(run_dir)["end"] == "failed"
