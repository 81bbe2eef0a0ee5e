"""A multi-rank job on the real dev Slurm cluster: ``orch submit --backend slurm --nproc-per-node 2``
runs through the real path (sbatch --nodes=1 --ntasks-per-node=1 -> orch's wrapper -> srun -> one torchrun
-> 2 gloo ranks), is preempted by a real ``prio`` job and requeued in place by Slurm: ONE attempt, 0 steps
redone on either rank, verified. (One machine is one node: ``--nodes 2`` is checked by composition only,
tests/unit/test_ranks.py.)
"""

from __future__ import annotations

import json
import os
import sys

from orchkit import wait_for
from rankkit import GLOO_ENV, TORCHRUN_ENV, rank_envs, rank_program, steps_done
from slurmkit import cancel_all_of, node_idle, run

from orchestrator import protocol

DONE = "done_marker_verified"
STEPS = 300  # ~30 s at ~10 steps/s: outlasts the preemption (1-22 s after the prio job was submitted, measured)


def test_two_ranks_through_srun_torchrun_preempted_requeued_in_place_zero_steps_redone(orch, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    os.chmod(tmp_path, 0o755)
    prog = rank_program(tmp_path)
    prio: list[str] = []
    node_idle()
    try:
        p = orch("submit", "--backend", "slurm", "--partition", "spot", "--name", "mrs", "--cpus-per-task", "1",
                 "--mem", "3G", "--nproc-per-node", "2", "--", sys.executable, str(prog), "--max-steps", str(STEPS),
                 "--sleep", "0.1", "--log-dir", str(logs), env=GLOO_ENV)
        assert p.returncode == 0, p.stdout + p.stderr
        run_dir = orch.runs / "mrs"
        job_id = orch.show("mrs")["attempts"][0]["external_id"]
        sbatch = json.loads((run_dir / "attempts/1/slurm" / protocol.SLURM_SUBMITTED).read_text())["sbatch"]
        assert "--nodes=1" in sbatch and "--ntasks-per-node=1" in sbatch, sbatch
        _drive(orch, lambda: len(steps_done(logs, 1)) >= 10, 120, "both ranks stepping")
        envs = rank_envs(logs, 1)
        assert envs.keys() == {0, 1}
        for rank, env in envs.items():
            assert all(env[k] for k in TORCHRUN_ENV) and (int(env["RANK"]), env["WORLD_SIZE"]) == (rank, "2"), env
        wrapper = json.loads((run_dir / "attempts/1" / protocol.WRAPPER_FILE).read_text())
        assert wrapper["ranks_command"][0] == "srun", wrapper  # the real srun/torchrun path
        p = run("sbatch", "--parsable", "-p", "prio", "-c", "2", "--mem=200M", "-o", "/dev/null", "--wrap", "sleep 2")
        assert p.returncode == 0, p.stderr
        prio.append(p.stdout.strip())
        _drive(orch, lambda: orch.state("mrs") in {DONE, "failed", "cancelled", "retryable_failed"}, 300, "the end")
        show = orch.show("mrs")
        assert show["state"] == DONE, show
        assert len(show["attempts"]) == 1, show["attempts"]
        a = show["attempts"][0]
        assert (a["state"], a["external_id"], a["restarts"]) == ("succeeded", job_id, 1), a
        assert (a["world_size"], a["nodes"]) == (2, os.uname().nodename), a
        first = json.loads((run_dir / "attempts/1/failure.prev-1.json").read_text())
        assert first["class"] == "preempted" and first["step"] < STEPS, first
        for rank in (0, 1):
            steps = [s for _a, s in steps_done(logs, rank)]
            assert steps == list(range(1, STEPS + 1)), (rank, steps[:5], len(steps))  # 0 redone, none skipped
        assert rank_envs(logs, 1).keys() == {0, 1}
        sacct = run("sacct", "-X", "--duplicates", "-n", "-P", "-j", job_id, "-o", "State").stdout.split()
        assert sacct[0] == "PREEMPTED", sacct  # Slurm requeued it in place: not FAILED during the grace
        assert orch("verify", "mrs").stdout == "VERIFIED\n"
        print(f"\n[measured] stopped at step {first['step']} ({first['at']}); sacct {sacct}")
    finally:
        cancel_all_of(orch, prio)


def _drive(orch, cond, timeout: float, what: str) -> None:
    """Reconcile (as cron would) until ``cond()``."""
    def reached() -> bool:
        if cond():
            return True
        orch("reconcile", check=True)
        return False

    wait_for(reached, timeout, what, interval=1, detail=lambda: orch.show("mrs"))
