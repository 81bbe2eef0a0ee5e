"""Node failure and a cgroup OOM kill on the real dev cluster (both were tested only against
faked sacct output).

- A node set DOWN under a running job (``scontrol update nodename=... state=down``): Slurm ends the run
  NODE_FAIL; orch never counts it against ``--max-attempts`` and the job ends verified once the node is
  back. The node is resumed in a ``finally``, whatever the test saw.
- A job over its ``--mem``: the kernel kills it in its memory cgroup (task/cgroup, ConstrainRAMSpace in
  deploy/slurm/cluster.sh), sacct says OUT_OF_MEMORY, and orch classifies ``oom``.
"""

from __future__ import annotations

import json
import socket
import sys
import time

import pytest
from orchkit import wait_for
from slurmkit import SlurmKit, cancel_all_of, node_idle, phases, run

from orchestrator import protocol
from orchestrator.backends.base import Phase
from orchestrator.decide.classify import classify

ABSENT = protocol.Verification(protocol.MarkerStatus.ABSENT, "no done.json")
HOST = socket.gethostname().split(".")[0]
TRAINER = [sys.executable, "-m", "orch_trainer", "--preset", "tiny", "--threads", "1", "--log-interval", "100",
           "--heartbeat-interval", "0.5"]
DONE = "done_marker_verified"


def node_state() -> str:
    return run("sinfo", "-h", "-N", "-n", HOST, "-o", "%T").stdout.strip()


def resume_node() -> None:
    """Bring the node back (idempotent); wait until it takes jobs again, so the next test finds it usable."""
    run("scontrol", "update", f"nodename={HOST}", "state=resume")
    wait_for(lambda: node_state().rstrip("*").startswith(("idle", "mixed", "allocated")), 60,
             f"node {HOST} to take jobs after state=resume", interval=0.5, detail=node_state)


def sacct_runs(job_id: str) -> list[str]:
    """The state of every run of a Slurm job id, oldest first (a requeue in place adds a run)."""
    out = run("sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o", "State").stdout.split()
    return [s.split(" ", 1)[0] for s in out]


def test_a_job_over_its_mem_is_killed_by_its_cgroup_and_classified_oom(slurm: SlurmKit, script) -> None:
    prog = script("hog", "import time\nb = bytearray(600 * 2**20)\nfor i in range(0, len(b), 4096):\n"
                  "    b[i] = 1\ntime.sleep(60)\n")
    r = slurm.submit(slurm.spec("hog", prog, mem_mb=100))
    out = slurm.poll_until([r], lambda o: phases(o, r) == (Phase.EXITED,), timeout=90)
    oc = out[r.token]
    sacct = run("sacct", "-X", "-n", "-P", "-j", r.external_id, "-o", "State,ExitCode").stdout.strip()
    # The kernel's OOM kill in the job's memory cgroup, as Slurm records it (not the accounting poller's
    # FAILED 0:9, which this cluster no longer produces: tests/unit/test_slurm_states.py keeps that form).
    assert sacct.startswith("OUT_OF_MEMORY|"), sacct
    assert oc.backend_state == "OUT_OF_MEMORY", oc
    assert classify(oc, None, ABSENT, exit_record=protocol.read_exit(protocol.attempt_dir(r.run_dir, 1),
                                                                     r.token)).cls == "oom"
    print(f"\n[measured] cgroup OOM: sacct {sacct}; outcome {oc}")


@pytest.fixture
def cleanup(orch):
    """Every Slurm job of this test's orch home is cancelled at its end."""
    yield
    cancel_all_of(orch)


def test_a_node_set_down_under_a_job_is_node_fail_never_counted_and_the_job_ends_verified(orch, cleanup) -> None:
    node_idle()
    name = "nodefail"
    p = orch("submit", "--backend", "slurm", "--name", name, "--cpus-per-task", "1", "--mem", "1G",
             "--max-attempts", "1", "--", *TRAINER, "--max-steps", "400", "--save-interval", "20")
    assert p.returncode == 0, p.stdout + p.stderr
    run_dir = orch.runs / name
    ids: list[str] = []
    log: list = []

    def drive(until, timeout: float) -> dict:
        t0 = time.monotonic()

        def passed() -> dict | None:
            orch("reconcile", check=True)
            show = orch.show(name)
            ids.extend(a["external_id"] for a in show["attempts"] if a["external_id"] not in ids)
            log.append((round(time.monotonic() - t0, 1), show["state"], [(a["n"], a["state"], a["restarts"],
                        a["backend_state"], a["failure_class"]) for a in show["attempts"]], node_state()))
            return show if until(show) else None

        return wait_for(passed, timeout, f"{name} to reach the state asked for", interval=1,
                        detail=lambda: "\n" + "\n".join(map(str, log[-30:])))

    try:
        def stepped(_show: dict) -> bool:
            prog = protocol.read_progress(run_dir, 1) or {}
            return int(prog.get("step") or 0) >= 25
        drive(stepped, timeout=120)
        first = ids[0]
        down = run("scontrol", "update", f"nodename={HOST}", "state=down", "reason=orch-test-node-fail")
        assert down.returncode == 0, down.stderr
        # Slurm ends the run NODE_FAIL (and, the job being --requeue, may requeue it in place); orch must
        # not take that for the job's own failure while the node is down.
        wait_for(lambda: "NODE_FAIL" in sacct_runs(first), 90, f"sacct to show {first} NODE_FAIL", interval=1,
                 detail=lambda: (sacct_runs(first), node_state()))
        drive(lambda s: True, timeout=10)
    finally:
        resume_node()
    show = drive(lambda s: s["state"] in (DONE, "failed", "cancelled"), timeout=300)
    print("\n[measured] node failure:\n" + "\n".join(map(str, log)) + f"\nsacct runs {[sacct_runs(i) for i in ids]}")
    print(json.dumps(show["attempts"], indent=1)[:4000])
    assert show["state"] == DONE, log
    assert "NODE_FAIL" in sacct_runs(first)
    # Never counted: --max-attempts 1 would have failed the job on a counted end.
    assert all(a["counted"] is False or a["state"] == "succeeded" for a in show["attempts"]), show["attempts"]
    a1 = show["attempts"][0]
    assert node_state().rstrip("*").startswith(("idle", "mixed", "allocated")), node_state()
    # Seen on this cluster (Slurm 22.05, the job --requeue): Slurm requeues the run in place, so the same attempt
    # runs again under the same id once the node is back, and ends verified.
    assert (a1["state"], a1["external_id"], len(show["attempts"])) == ("succeeded", first, 1), show["attempts"]
    assert a1["restarts"] >= 1 and a1["restart_history"], a1
    causes = [h["class"] for h in a1["restart_history"]]
    # Found by this test: orch knew why a run restarted in place only from the run's own records (a delivered stop
    # signal reads "preempted"), never from the scheduler (sacct says NODE_FAIL), so `orch show` and the
    # preemption count called a node failure a preemption. The scheduler's account of each run now wins.
    assert causes[:1] == ["node_fail"], a1["restart_history"]
    assert show["preemptions"]["in_place"] == 0, show["preemptions"]
