"""submitit code on the real dev Slurm cluster: an ``OrchExecutor(backend="slurm")`` job on ``spot`` (Slurm
requeues it in place) is preempted by a real ``prio`` job, checkpoints at its next ``safe_point()`` through the
callable's own ``checkpoint()``, resumes from that pickle and ends ``done_marker_verified``.

Claims: 0 optimizer updates applied twice (the example's update log), final weights bit-identical to the same
callable run once without interruption, ``job.result()`` returns them.

The same prio job also preempts the plain loop (examples/plain_loop.py through the CLI) on ``spot-cancel``, on
the node's other core: Slurm ends it PREEMPTED, orch requeues it, it ends verified with 0 steps redone. That is
the CI run of the integrations' real-preemption e2e (ORCH_LONG, which runs the long variants, is never
set there), at no extra wait: the submitit job left the other core idle.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from pathlib import Path

import pytest
from orchkit import wait_for
from slurmkit import cancel_all_of, node_idle, run

from orchestrator import protocol
from orchestrator.integrations.submitit import OrchExecutor

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
from submitit_train import TrainLoop  # noqa: E402 - examples/ is no package

DONE = "done_marker_verified"
STEPS = 400
PLAIN_STEPS = 600  # 48 s of steps at 0.08 s each: it must outlast the preemption (7-30 s after the prio job)


@pytest.fixture
def executor(orch, monkeypatch):
    """An OrchExecutor in this process with the test's ORCH_HOME (sbatch --export=ALL passes this environment
    on); every Slurm job is cancelled at the end."""
    for k in list(os.environ):
        if k.startswith(("ORCH_", "SLURM_", "SUBMITIT_")):
            monkeypatch.delenv(k)
    for k, v in {**orch.env, "ORCH_HEARTBEAT_S": "0.5"}.items():
        monkeypatch.setenv(k, v)
    extra: list[str] = []
    yield OrchExecutor(backend="slurm", poll_s=1.0), extra
    cancel_all_of(orch, extra)


def test_e2e_orch_executor_on_spot_and_the_plain_loop_on_spot_cancel_survive_a_real_preemption(orch, executor,
                                                                                                tmp_path):
    ex, extra = executor
    node_idle()
    updates = tmp_path / "updates.log"
    ex.update_parameters(orch_name="sitslurm", slurm_partition="spot", cpus_per_task=1, mem_gb=3, timeout_min=30)
    job = ex.submit(TrainLoop(STEPS, step_log=str(updates), sleep_per_step=0.08))
    run_dir = orch.runs / "sitslurm"
    plain_log, plain_dir = tmp_path / "plain.log", orch.runs / "plain"
    # --wandb: Slurm signals W&B's service process too, and that must cost the loop no checkpoint.
    p = orch("submit", "--backend", "slurm", "--name", "plain", "--partition", "spot-cancel", "--cpus-per-task", "1",
             "--mem", "3G", "--", sys.executable, str(ROOT / "examples" / "plain_loop.py"), "--max-steps",
             str(PLAIN_STEPS), "--sleep-per-step", "0.08", "--step-log", str(plain_log), "--wandb",
             env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    assert p.returncode == 0, p.stdout + p.stderr

    def step(d: Path) -> int:
        return int((protocol.read_progress(d, 1) or {}).get("step") or 0)

    t0, history = time.time(), []

    def both_at_step_20() -> bool:
        if step(run_dir) >= 20 and step(plain_dir) >= 20:
            return True
        orch("reconcile", check=True)
        history.append((round(time.time() - t0, 1), job.state, step(run_dir), step(plain_dir)))
        return False

    wait_for(both_at_step_20, 240, "both jobs at step 20", interval=1, detail=lambda: history)
    p = run("sbatch", "--parsable", "-p", "prio", "-c", "2", "--mem=200M", "-o", "/dev/null", "--wrap", "sleep 2")
    assert p.returncode == 0, p.stderr
    extra.append(p.stdout.strip())
    job.wait(timeout_s=600)  # reconcile passes in this process, as `orch submit --wait` runs them
    out = job.result()

    show = orch.show("sitslurm")
    assert show["state"] == DONE, json.dumps(show)
    (attempt,) = show["attempts"]
    assert attempt["restarts"] == 1, attempt  # requeued in place by Slurm: one orch attempt, rerun once
    first = json.loads((protocol.attempt_dir(run_dir, 1) / "failure.prev-1.json").read_text())
    assert first["class"] == "preempted" and "called at safe_point()" in first["detail"], first
    assert first["checkpoint"] == f"checkpoints/{protocol.checkpoint_name(first['step'])}", first

    steps = [int(s) for _, s in (ln.split() for ln in updates.read_text().splitlines() if ln.strip())]
    counts = collections.Counter(steps)
    assert sorted(counts) == list(range(1, STEPS + 1)) and max(counts.values()) == 1, counts.most_common(3)
    assert steps[steps.index(first["step"]) + 1] == first["step"] + 1  # the rerun began right after it
    reference = TrainLoop(STEPS)()
    assert out["steps"] == STEPS and all(
        (out["state_dict"][k] == reference["state_dict"][k]).all() for k in reference["state_dict"])
    v = orch("verify", "sitslurm")
    assert (v.returncode, v.stdout) == (0, "VERIFIED\n")

    # The plain loop on spot-cancel: preempted once, requeued by orch, every step computed exactly once.

    def plain_ended() -> bool:
        if orch.state("plain") in (DONE, "failed", "cancelled"):
            return True
        orch("reconcile", check=True)
        return False

    wait_for(plain_ended, 600, "plain to end", interval=1, detail=lambda: orch.show("plain"))
    plain = orch.show("plain")
    assert plain["state"] == DONE and [a["failure_class"] for a in plain["attempts"]] == ["preempted", None], plain
    plain_steps = collections.Counter(int(s) for _, s in (ln.split() for ln in plain_log.read_text().splitlines()
                                                          if ln.strip()))
    assert sorted(plain_steps) == list(range(1, PLAIN_STEPS + 1)), plain_steps.most_common(3)
    assert max(plain_steps.values()) == 1, plain_steps.most_common(3)  # 0 steps redone
    # W&B's service got the preemption's SIGTERM too (a W&B call after it, if any, was noted); one W&B run.
    wandb_runs = sorted((plain_dir / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 2 and all(d.name.endswith("-" + protocol.stable_run_id(plain_dir, "plain"))
                                        for d in wandb_runs), wandb_runs
    v = orch("verify", "plain")
    assert (v.returncode, v.stdout) == (0, "VERIFIED\n")
    print(f"\n[measured] stopped at step {first['step']} ({first['detail']}); 0 updates redone; bit-exact; "
          f"verified {time.time() - t0:.0f} s after submission")
