"""The README's ``--backend slurm`` commands, as a new user types them, on the dev cluster.

The cluster is one node (``vm``: 2 CPUs, ~22 GB, gpu:2). What it can hold runs as written: the 9-task sweep, every
task verified. ``lm1`` (8 CPUs, 32G) and ``big`` (4 nodes) ask for more than it has: orch submits them (exit 0) and
Slurm holds them for good (``PartitionConfig``), which is Slurm's answer, not orch's; ``orch cancel`` then ends
them. Each of the two is run again with its sizes scaled to this cluster (``AS_RUN_HERE``) and must end verified.
tests/docs/test_readme_commands.py checks that these are all of the README's Slurm commands.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from orchkit import ROOT, wait_for
from readmekit import DONE, all_ended, run_cmd, status, user_dir
from slurmkit import run

LM1 = ("orch submit --name lm1 --backend slurm --partition spot --gpus 1 --cpus-per-task 8 --mem 32G "
       "--time 1-00:00:00 --max-attempts 3 -- .venv/bin/python -m orch_trainer --preset tiny --max-steps 2000")
BIG = "orch submit --name big --backend slurm --nodes 4 --nproc-per-node 8 --gpus-per-node 8 -- python train.py"
SWEEP = ("orch sweep --name lr --grid lr=1e-3,3e-4,1e-4 --grid seed=0,1,2 --throttle 4 --backend slurm "
         "--partition spot --gpus 1 -- python train.py --lr {lr} --seed {seed}")
# README command -> what runs here: the same, or its sizes scaled to the one-node, 2-CPU cluster.
AS_RUN_HERE = {
    SWEEP: SWEEP,
    LM1: LM1.replace("--cpus-per-task 8 --mem 32G", "--cpus-per-task 1 --mem 2G").replace("2000", "60"),
    BIG: BIG.replace("--nodes 4 --nproc-per-node 8 --gpus-per-node 8",
                     "--nodes 1 --nproc-per-node 2 --gpus-per-node 2"),
}
TOO_BIG = {"lm1": LM1, "big": BIG}


def _cwd(cmd: str, work):
    """The quick start's venv path (.venv/bin/python) is the checkout's; train.py is the user's."""
    return ROOT if ".venv/" in cmd else work


def _job_ids(work, env, name: str) -> list[str]:
    p = run_cmd(f"orch show {name} --json", work, env)
    return [a["external_id"] for a in json.loads(p.stdout)["attempts"] if a.get("external_id")]


def _held_for_size(job_id: str) -> bool:
    """Pending for a reason that says the job is larger than the partition (it never starts here)."""
    return run("squeue", "-h", "-j", job_id, "-o", "%r").stdout.strip() in ("PartitionConfig", "PartitionNodeLimit")


@pytest.fixture
def user(tmp_path):
    work, env = user_dir(tmp_path)
    yield work, env
    ids = [i for name in status(work, env) for i in _job_ids(work, env, name)]
    if ids:
        run("scancel", *ids)


def test_the_readme_sweep_runs_as_written_on_slurm(user):
    work, env = user
    p = run_cmd(SWEEP, work, env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "sweep lr: 9 tasks on slurm, at most 4 at once" in p.stdout, p.stdout
    states = wait_for(lambda: all_ended(work, env), 600, "the sweep's 9 tasks to end", interval=2,
                      detail=lambda: status(work, env))
    assert states == {f"lr.{i:04d}": DONE for i in range(9)}, states


def test_the_readme_jobs_larger_than_this_cluster_are_held_by_slurm_and_run_scaled(user):
    work, env = user
    for name, cmd in TOO_BIG.items():
        p = subprocess.run(["bash", "-c", cmd], cwd=_cwd(cmd, work), env=env, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0 and re.match(rf"submitted {name} \(slurm \d+\)", p.stdout), p.stdout + p.stderr
        (job_id,) = _job_ids(work, env, name)
        wait_for(lambda j=job_id: _held_for_size(j), 60, f"Slurm to hold {name} for its size")
        assert run_cmd(f"orch cancel {name}", work, env).returncode == 0
    wait_for(lambda: all_ended(work, env), 120, "both to end cancelled", interval=1)
    assert status(work, env) == {"lm1": "cancelled", "big": "cancelled"}

    for name in TOO_BIG:  # scaled to this cluster, under new names
        cmd = AS_RUN_HERE[TOO_BIG[name]].replace(f"--name {name} ", f"--name {name}-here ")
        p = subprocess.run(["bash", "-c", cmd], cwd=_cwd(cmd, work), env=env, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
    wait_for(lambda: all_ended(work, env), 600, "the scaled jobs to end", interval=2, detail=lambda: status(work, env))
    assert status(work, env) == {"lm1": "cancelled", "big": "cancelled", "lm1-here": DONE, "big-here": DONE}
