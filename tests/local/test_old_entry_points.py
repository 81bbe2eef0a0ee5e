"""A job started before orch's compute-node code moved to ``orchestrator/jobside/`` runs its wrapper as ``python -m
orchestrator.wrapper`` and each rank's parent as ``python -m orchestrator.rankend``; a user who upgrades orch while
it trains must see it alive, stopped and resumed by the new code, never taken for a dead job. Real processes, real
torchrun, two ranks, the bundled trainer."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from orchkit import PY, ROOT, wait_for

from orchestrator import protocol
from orchestrator.jobside import proctable, supervisor

DONE = "done_marker_verified"
TRAINER = [sys.executable, "-m", "orch_trainer", "--preset", "tiny", "--max-steps", "1500", "--save-interval", "40"]
# The two lines of a launch's argv that the move changed: the older orch wrote these module names.
OLD_NAMES = {"backends/base.py": '"orchestrator.jobside.wrapper"',
             "jobside/ranklaunch.py": '"orchestrator.jobside.rankend"'}


def older_orch(where: Path) -> Path:
    """This tree as the orch before the move launched: its wrapper and rank parents named by the old modules."""
    shutil.copytree(ROOT / "orchestrator", where / "orchestrator", ignore=shutil.ignore_patterns("__pycache__"))
    for rel, name in OLD_NAMES.items():
        path = where / "orchestrator" / rel
        text = path.read_text()
        assert name in text, (rel, name)  # the launch still names it so; else this test tests nothing
        path.write_text(text.replace(name, name.replace("jobside.", "")))
    return where


def argv_of(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def job_procs(run_dir: Path, module: bytes) -> list[int]:
    """Pids running as ``python -m module`` (not torchrun, whose argv names it too) for ``run_dir`` (their
    environment names it, or the wrapper's argv)."""
    want = f"{protocol.ENV_RUN_DIR}={run_dir}".encode()
    out = []
    for p in proctable.all_procs():
        try:
            argv = argv_of(p.pid)
            if argv[1:3] == [b"-m", module] and (str(run_dir).encode() in argv or
                                   want in Path(f"/proc/{p.pid}/environ").read_bytes().split(b"\0")):
                out.append(p.pid)
        except OSError:
            continue
    return out


def test_a_two_rank_job_started_under_the_old_module_names_is_seen_alive_then_stopped_and_resumed(orch, tmp_path):
    old = older_orch(tmp_path / "old")
    p = subprocess.run([PY, "-m", "orchestrator.cli", "submit", "--name", "up", "--nproc-per-node", "2", "--",
                        *TRAINER], capture_output=True, text=True, timeout=120, cwd=old,
                       env={**orch.env, "PYTHONPATH": str(old)})
    assert p.returncode == 0, p.stderr
    run_dir = orch.runs / "up"
    wait_for(lambda: (protocol.read_progress(run_dir, 1) or {}).get("step", 0) > 40, 120, "a first checkpoint")
    (old_wrapper,) = job_procs(run_dir, b"orchestrator.wrapper")
    assert str(old / "orchestrator" / "jobside" / "wrapper.py").encode() not in argv_of(old_wrapper)
    parents = job_procs(run_dir, b"orchestrator.rankend")
    assert len(parents) == 2, parents
    # The new code knows them: the wrapper by its argv (a program that cleared its environment is found through it),
    # each rank's parent as one (the wrapper leaves it to end its rank).
    assert proctable.wrapper_run_dir(old_wrapper) == str(run_dir)
    assert all(supervisor.is_rank_parent(pid) for pid in parents)
    orch("reconcile", check=True)
    assert orch.show("up")["attempts"][0]["state"] == "running", orch.show("up")

    os.kill(old_wrapper, signal.SIGTERM)  # a preemption, as Slurm's and the local backend's stop reach the job
    assert orch.wait("up", {DONE, "failed", "cancelled"}, timeout=240) == DONE, orch.show("up")
    first, second = orch.show("up")["attempts"]
    assert (first["failure_class"], first["action"]["auto"]) == ("preempted", True), first
    stopped_at = protocol.read_json_bounded(protocol.attempt_dir(run_dir, 1) / protocol.FAILURE_FILE)["step"]
    assert protocol.read_progress(run_dir, 2)["resumed_from"] == stopped_at > 40, stopped_at
    assert orch("verify", "up").stdout == "VERIFIED\n"
