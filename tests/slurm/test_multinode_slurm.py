"""Many nodes for real (issue 31): a 2-node job on the dev cluster's several slurmd nodes (deploy/slurm/cluster.sh:
this host's node and n2, n3, each its own slurmd; partitions multi and multi-prio).

`orch submit --backend slurm --nodes 2 --nproc-per-node 2` runs one torchrun per node through srun, with the c10d
rendezvous at the first node's name: four ranks on two nodes train the plain-loop example with DDP over gloo. A real
`multi-prio` job preempts it; every rank on both nodes stops at the same step (orch's stop agreement), Slurm requeues
the job in place, and the rerun resumes with no step computed twice by any rank. All nodes share one kernel and one
network namespace (what that does and does not show: deploy/slurm/README.md).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from orchkit import ROOT, wait_for
from slurmkit import cancel_all_of, cluster_up_with, kill_node, node_idle, run

from orchestrator import protocol

STEPS = 600
LOOP = [sys.executable, str(ROOT / "examples" / "plain_loop.py"), "--max-steps", str(STEPS), "--save-every", "50",
        "--sleep-per-step", "0.05"]


@pytest.fixture
def cleanup(orch):
    extra: list[str] = []
    yield extra
    cancel_all_of(orch, extra)


def settled(orch, name: str) -> bool:
    """One paced reconcile pass (as cron would), then whether the job has ended."""
    orch.reconcile_paced()
    return orch.polled_state(name) in ("done_marker_verified", "failed", "retryable_failed")


def hostnames(nodelist: str) -> list[str]:
    p = run("scontrol", "show", "hostnames", nodelist)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def test_a_two_node_job_rendezvous_across_slurmd_nodes_survives_a_preemption_with_no_step_redone(orch, cleanup):
    node_idle()
    step_log = orch.home / "steps.log"  # every rank appends "<attempt> <step> <rank>" per step it completes
    p = orch("submit", "--backend", "slurm", "--partition", "multi", "--nodes", "2", "--nproc-per-node", "2",
             "--cpus-per-task", "1", "--mem", "2G", "--name", "mn", "--", *LOOP, "--step-log", str(step_log))
    assert p.returncode == 0, p.stdout + p.stderr
    run_dir = orch.runs / "mn"
    job_id = orch.show("mn")["attempts"][0]["external_id"]

    def step() -> int:
        return int((protocol.read_progress(run_dir, 1) or {}).get("step") or 0)

    wait_for(lambda: step() >= 20, 180, "the 2-node job at step 20", detail=lambda: (
        run("squeue", "-j", job_id).stdout, (run_dir / "attempts" / "1" / "stderr.log").read_text()[-2000:]
        if (run_dir / "attempts" / "1" / "stderr.log").exists() else ""))
    q = run("sbatch", "--parsable", "-p", "multi-prio", "-N", "3", "-c", "2", "--mem=200M", "-o", "/dev/null",
            "--wrap", "sleep 2")
    assert q.returncode == 0, q.stderr  # every CPU of every node: it preempts the job on both of its nodes
    cleanup.append(q.stdout.strip())

    wait_for(lambda: settled(orch, "mn"), 420, "the 2-node job to end", interval=1, detail=lambda: (
        run("sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o", "State,NodeList").stdout,
        json.dumps(orch.show("mn"))[-3000:]))
    show = orch.show("mn")
    a = show["attempts"][0]
    assert show["state"] == "done_marker_verified", show
    # one attempt, requeued in place once by Slurm, on two distinct nodes, four ranks
    runs = run("sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o", "State,NodeList").stdout.split()
    assert [r.split("|")[0] for r in runs] == ["PREEMPTED", "COMPLETED"], runs
    assert (a["restarts"], a["world_size"]) == (1, 4), a
    nodes = hostnames(a["nodes"])
    assert len(set(nodes)) == 2, a["nodes"]
    # each rank says where it ran: two ranks on each node, a node's ranks consecutive
    ends = {}
    for path in (run_dir / "attempts" / "1" / "torchrun").glob("rank-end.*.json"):
        r = json.loads(path.read_text())
        ends.setdefault(r["launch"], {})[r["rank"]] = r["node"]
    launch = json.loads((run_dir / "attempts" / "1" / protocol.WRAPPER_FILE).read_text())["launch"]
    # torchrun's c10d rendezvous numbers the nodes in the order they joined (ranks 0-1 were on the second host once)
    by_node = {n: {r for r, m in ends[launch].items() if m == n} for n in nodes}
    assert sorted(map(sorted, by_node.values())) == [[0, 1], [2, 3]], ends
    # every rank stopped at the same step and the rerun resumed there: each (step, rank) computed exactly once
    first_run = json.loads((run_dir / "attempts" / "1" / "failure.prev-1.json").read_text())
    assert first_run["class"] == "preempted" and 20 <= first_run["step"] < STEPS, first_run
    done = Counter(tuple(line.split()) for line in step_log.read_text().splitlines())
    assert [k for k, n in done.items() if n > 1] == [], "steps computed twice"
    assert set(done) == {("1", str(s), str(r)) for s in range(1, STEPS + 1) for r in range(4)}
    assert show["preemptions"] == {"total": 1, "in_place": 1}
    g = show["goodput"]["attempts"][0]
    assert (g["runs"], g["held_from"], g["steps_redone"]) == (2, "scheduler", 0), g
    print(f"\n[measured] 2 nodes x 2 ranks on {a['nodes']}: preempted at step {first_run['step']}, "
          f"resumed in place; held {g['held_s']:.1f} s in 2 runs")


def test_a_two_node_job_requeued_on_one_node_resumes_there_with_no_step_redone(orch, cleanup):
    """After losing a node a user asks for fewer: `orch requeue NAME --nodes 1` runs the next attempt on one node
    (sbatch --nodes=1, one torchrun), resuming the 2-node checkpoint (the kit resumes on any world size)."""
    node_idle()
    step_log = orch.home / "steps.log"
    p = orch("submit", "--backend", "slurm", "--partition", "multi", "--nodes", "2", "--nproc-per-node", "1",
             "--cpus-per-task", "1", "--mem", "2G", "--name", "shrink", "--", *LOOP[:3], "200", *LOOP[4:],
             "--step-log", str(step_log))
    assert p.returncode == 0, p.stdout + p.stderr
    run_dir = orch.runs / "shrink"
    wait_for(lambda: int((protocol.read_progress(run_dir, 1) or {}).get("step") or 0) >= 20, 180, "step 20")
    assert orch("cancel", "shrink").returncode == 0

    def ended(state: str):
        def check() -> bool:
            orch.reconcile_paced()
            return orch.polled_state("shrink") == state
        return check

    wait_for(ended("cancelled"), 120, "the cancel to settle", interval=1)
    wait_for(lambda: orch.reconcile_paced() or orch.show("shrink")["attempts"][0]["state"] == "cancelled", 120,
             "attempt 1 to have exited (a requeue waits for it)", interval=1)
    r = orch("requeue", "shrink", "--nodes", "1")
    assert r.returncode == 0 and "on 1 node x 1 rank, was 2 nodes x 1 rank" in r.stdout, r.stdout + r.stderr
    wait_for(ended("done_marker_verified"), 300, "the 1-node attempt to verify", interval=1)
    a1, a2 = orch.show("shrink")["attempts"]
    assert (a1["world_size"], len(set(hostnames(a1["nodes"])))) == (2, 2), a1
    assert (a2["world_size"], len(hostnames(a2["nodes"]))) == (1, 1), a2
    resumed = protocol.read_progress(run_dir, 2)["resumed_from"]
    done = Counter(tuple(line.split()[:2]) for line in step_log.read_text().splitlines())
    # attempt 1's two ranks each logged steps 1..resumed; attempt 2's one rank resumed..200, none twice
    assert {k for k in done if k[0] == "1"} == {("1", str(s)) for s in range(1, resumed + 1)}, resumed
    assert all(done[("1", str(s))] == 2 for s in range(1, resumed + 1))
    assert {k for k in done if k[0] == "2"} == {("2", str(s)) for s in range(resumed + 1, 201)}
    assert all(done[("2", str(s))] == 1 for s in range(resumed + 1, 201))


def rank_program_pid(job_id: str, rank: int) -> int | None:
    """The pid of rank ``rank``'s program (plain_loop.py itself, not orch's per-rank parent) of Slurm job
    ``job_id``: every node's processes share this kernel, so a node's rank is a process here."""
    want = {f"SLURM_JOB_ID={job_id}".encode(), f"RANK={rank}".encode()}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            if len(argv) > 1 and argv[1].endswith(b"plain_loop.py") and \
                    want <= set((d / "environ").read_bytes().split(b"\0")):
                return int(d.name)
        except OSError:
            continue
    return None


def test_a_rank_killed_on_a_two_node_job_is_restarted_inside_the_allocation_not_requeued(orch, cleanup):
    """`--rank-restarts`: a rank SIGKILLed (an ECC error, a kill -9) ends the job step; the wrapper starts a new step
    in the same allocation, resuming from the commit, with no trip through Slurm's queue."""
    node_idle()
    step_log = orch.home / "steps.log"
    steps = 200
    p = orch("submit", "--backend", "slurm", "--partition", "multi", "--nodes", "2", "--nproc-per-node", "1",
             "--rank-restarts", "2", "--cpus-per-task", "1", "--mem", "2G", "--name", "rk", "--", *LOOP[:3],
             str(steps), *LOOP[4:], "--step-log", str(step_log))
    assert p.returncode == 0, p.stdout + p.stderr
    run_dir = orch.runs / "rk"
    job_id = orch.show("rk")["attempts"][0]["external_id"]
    wait_for(lambda: int((protocol.read_progress(run_dir, 1) or {}).get("step") or 0) >= 60, 180, "step 60")
    pid = rank_program_pid(job_id, 1)
    assert pid is not None
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)

    wait_for(lambda: settled(orch, "rk"), 300, "the job to end", interval=1,
             detail=lambda: json.dumps(orch.show("rk"))[-3000:])
    show = orch.show("rk")
    assert show["state"] == "done_marker_verified", show
    (a,) = show["attempts"]
    assert (a["restarts"], a["world_size"]) == (0, 2), a  # never requeued: Slurm ran the job once
    (r,) = a["rank_restarts"]
    assert (r["class"], r["failed_rank"], r["rank_returncode"]) == ("killed", 1, -signal.SIGKILL), r
    assert r["resume_step"] >= 50, r
    runs = run("sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o", "State").stdout.split()
    assert runs == ["COMPLETED"], runs
    steps_run = run("sacct", "-n", "-P", "-j", job_id, "-o", "JobID").stdout.split()
    assert {f"{job_id}.0", f"{job_id}.1"} <= set(steps_run), steps_run  # the failed step and the relaunch
    done = Counter(tuple(line.split()[1:]) for line in step_log.read_text().splitlines())
    assert set(done) == {(str(s), str(rk)) for s in range(1, steps + 1) for rk in range(2)}
    again = sorted({int(s) for (s, _rk), n in done.items() if n > 1})
    assert all(r["resume_step"] < s <= r["failed_step"] + 1 for s in again), (again, r)
    beats = [json.loads(x) for x in (run_dir / "attempts" / "1" / protocol.PROGRESS_HISTORY).read_text().splitlines()]
    back = min(b["time"] for b in beats if b["time"] > killed_at and b.get("resumed_from") == r["resume_step"]
               and (b.get("step") or 0) > r["resume_step"])  # the relaunch's first step, not a survivor's last beat
    print(f"\n[measured] rank 1 SIGKILLed at step {r['failed_step']}: training again (a step past {r['resume_step']}) "
          f"{back - killed_at:.1f} s later, in the same allocation; {len(again)} steps computed again")


@pytest.fixture(scope="module")
def short_slurmd_timeout():
    """SlurmdTimeout 20 s for the node-kill tests, the module's last (Slurm's 300 s would hold a dead node's job 5
    minutes); then the defaults again, and the nodes they killed back up."""
    cluster_up_with(ORCH_SLURM_SLURMD_TIMEOUT_S="20")
    yield
    cluster_up_with()


@pytest.fixture
def nodes_back(short_slurmd_timeout):
    """Every node up and idle before the test (the one an earlier test killed restarted: cluster.sh up)."""
    cluster_up_with(ORCH_SLURM_SLURMD_TIMEOUT_S="20")
    node_idle()


def test_a_node_killed_under_a_two_node_job_ends_node_fail_and_the_rerun_on_healthy_nodes_verifies(
        orch, cleanup, nodes_back):
    """A power loss under a running 2-node job: its second node's slurmd and processes SIGKILLed, no signal first.
    Slurm marks the node down, the run ends NODE_FAIL and is requeued in place onto healthy nodes; orch counts
    one restart of class node_fail (no preemption, never against --max-attempts), and only steps after the last
    commit are computed again."""
    node_idle()
    step_log = orch.home / "steps.log"
    steps = 300
    p = orch("submit", "--backend", "slurm", "--partition", "multi", "--nodes", "2", "--nproc-per-node", "1",
             "--cpus-per-task", "1", "--mem", "2G", "--name", "nk", "--", *LOOP[:3], str(steps), *LOOP[4:],
             "--step-log", str(step_log))
    assert p.returncode == 0, p.stdout + p.stderr
    run_dir = orch.runs / "nk"
    job_id = orch.show("nk")["attempts"][0]["external_id"]
    wait_for(lambda: int((protocol.read_progress(run_dir, 1) or {}).get("step") or 0) >= 60, 180, "step 60")
    first_nodes = hostnames(run("squeue", "-h", "-j", job_id, "-o", "%N").stdout.strip())
    assert len(first_nodes) == 2, first_nodes
    dead = first_nodes[1]  # not the batch node: the wrapper there sees the run end
    assert kill_node(dead)
    wait_for(lambda: "down" in run("sinfo", "-h", "-n", dead, "-o", "%T").stdout, 120, f"{dead} marked down",
             interval=1)

    wait_for(lambda: settled(orch, "nk"), 300, "the job to end", interval=1, detail=lambda: (
        run("sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o", "State,NodeList").stdout,
        json.dumps(orch.show("nk"))[-3000:]))
    show = orch.show("nk")
    assert show["state"] == "done_marker_verified", show
    (a,) = show["attempts"]
    runs = [r.split("|") for r in run("sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o",
                                      "State,NodeList").stdout.split()]
    assert [state for state, _ in runs] == ["NODE_FAIL", "COMPLETED"], runs
    assert dead not in hostnames(runs[1][1]), runs  # the rerun landed on healthy nodes
    assert (a["restarts"], [h["class"] for h in a["restart_history"]]) == (1, ["node_fail"]), a
    assert show["preemptions"]["total"] == 0, show["preemptions"]  # a node's death is no preemption
    done = Counter(tuple(line.split()[1:]) for line in step_log.read_text().splitlines())
    assert set(done) == {(str(s), str(rk)) for s in range(1, steps + 1) for rk in range(2)}
    resumed = [b for b in (json.loads(x) for x in (run_dir / "attempts" / "1" / protocol.PROGRESS_HISTORY)
                           .read_text().splitlines()) if b.get("resumed_from")]
    resume = resumed[0]["resumed_from"]
    again = sorted({int(s) for (s, _rk), n in done.items() if n > 1})
    assert all(s > resume for s in again), (resume, again)  # nothing committed was computed twice
    print(f"\n[measured] node {dead} killed at step >= 60: NODE_FAIL, rerun in place on {runs[1][1]}, resumed from "
          f"{resume}; {len(again)} steps computed again")


@dataclass
class NodeLoss:
    """A node killed under a running job that recovers inside its allocation, and what the test reads after."""

    run_dir: Path
    job_id: str
    training: list[str]  # the nodes the ranks' first step ran on
    dead: str
    killed_at: float
    steps: int
    step_log: Path

    @property
    def adir(self) -> Path:
        return self.run_dir / "attempts" / "1"

    def relaunch_nodes(self) -> list[str]:
        srun = json.loads((self.adir / protocol.WRAPPER_FILE).read_text())["ranks_command"]
        return next(x for x in srun if x.startswith("--nodelist=")).split("=", 1)[1].split(",")

    def steps_done(self) -> Counter:
        return Counter(tuple(line.split()[1:]) for line in self.step_log.read_text().splitlines())

    def back_after(self, resume_step: int) -> float:
        """Seconds from the kill to the relaunch's first step past ``resume_step`` (not a survivor's last beat)."""
        beats = [json.loads(x) for x in (self.adir / protocol.PROGRESS_HISTORY).read_text().splitlines()]
        return min(b["time"] for b in beats if b["time"] > self.killed_at and b.get("resumed_from") == resume_step
                   and (b.get("step") or 0) > resume_step) - self.killed_at


def kill_a_node_under(orch, name: str, *opts: str) -> NodeLoss:
    """Submit a 300-step plain loop on ``multi`` with ``opts``, kill the second node its ranks train on (not the
    batch node: its wrapper restarts the ranks) past step 60, and wait for the job to end."""
    step_log = orch.home / "steps.log"
    steps = 300
    p = orch("submit", "--backend", "slurm", "--partition", "multi", "--nodes", "2", "--rank-restarts", "2",
             "--cpus-per-task", "1", "--mem", "1G", "--name", name, *opts, "--", *LOOP[:3], str(steps), *LOOP[4:],
             "--step-log", str(step_log))
    assert p.returncode == 0, p.stdout + p.stderr
    run_dir = orch.runs / name
    job_id = orch.show(name)["attempts"][0]["external_id"]
    wait_for(lambda: int((protocol.read_progress(run_dir, 1) or {}).get("step") or 0) >= 60, 180, "step 60")
    srun = json.loads((run_dir / "attempts" / "1" / protocol.WRAPPER_FILE).read_text())["ranks_command"]
    named = [a.split("=", 1)[1].split(",") for a in srun if a.startswith("--nodelist=")]
    allocation = hostnames(run("squeue", "-h", "-j", job_id, "-o", "%N").stdout.strip())
    loss = NodeLoss(run_dir, job_id, named[0] if named else allocation, "", time.time(), steps, step_log)
    loss.dead = loss.training[1]
    loss.killed_at = time.time()
    assert kill_node(loss.dead)
    wait_for(lambda: settled(orch, name), 300, "the job to end", interval=1, detail=lambda: (
        run("sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o", "State,NodeList").stdout,
        (loss.adir / "stderr.log").read_text()[-3000:]))
    return loss


def test_a_node_killed_under_a_job_with_a_spare_node_continues_on_the_spare_inside_the_allocation(
        orch, cleanup, nodes_back):
    """``--spare-nodes 1``: the allocation holds 3 nodes (sbatch --no-kill), the ranks train on 2. One of them
    dies: Slurm keeps the job, the wrapper restarts the ranks on the two nodes left, from the last commit; Slurm
    ran the job once, orch shows a node_fail rank restart naming the lost node, and the job ends verified."""
    loss = kill_a_node_under(orch, "sp", "--nproc-per-node", "1", "--spare-nodes", "1")
    assert len(loss.training) == 2, loss.training
    show = orch.show("sp")
    assert show["state"] == "done_marker_verified", show
    (a,) = show["attempts"]
    assert a["restarts"] == 0, a  # Slurm never requeued it
    (r,) = a["rank_restarts"]
    assert (r["class"], r["lost_nodes"]) == ("node_fail", [loss.dead]), r
    runs = run("sacct", "-X", "-n", "-P", "--duplicates", "-j", loss.job_id, "-o", "State").stdout.split()
    assert runs == ["RESIZING", "COMPLETED"], runs  # one run: the node's loss resized it (no requeue)
    now = loss.relaunch_nodes()
    assert loss.dead not in now and len(now) == 2, now  # the spare took the lost node's place
    done = loss.steps_done()
    assert set(done) == {(str(s), str(rk)) for s in range(1, loss.steps + 1) for rk in range(2)}
    again = sorted({int(s) for (s, _rk), n in done.items() if n > 1})
    assert all(s > r["resume_step"] for s in again), (again, r)
    print(f"\n[measured] node {loss.dead} killed at step >= 60 under 2 of 3 nodes: training again on {','.join(now)} "
          f"{loss.back_after(r['resume_step']):.1f} s later, in the same allocation; {len(again)} steps computed again")


def test_a_node_killed_under_a_job_allowed_fewer_nodes_goes_on_with_the_nodes_left_inside_the_allocation(
        orch, cleanup, nodes_back):
    """``--min-nodes 1``, no spare: 2 nodes x 2 ranks, one node dies. Slurm keeps the job (sbatch --no-kill), the
    wrapper restarts the ranks on the one node left (world size 4 -> 2) from the last commit, and the job ends
    verified: Slurm ran it once, the record names the lost node, and no committed step is computed again."""
    loss = kill_a_node_under(orch, "fw", "--nproc-per-node", "2", "--min-nodes", "1")
    assert len(loss.training) == 2, loss.training
    show = orch.show("fw")
    assert show["state"] == "done_marker_verified", show
    (a,) = show["attempts"]
    assert (a["restarts"], a["world_size"]) == (0, 2), a  # Slurm never requeued it; it ended on 1 node x 2 ranks
    (r,) = a["rank_restarts"]
    assert (r["class"], r["lost_nodes"]) == ("node_fail", [loss.dead]), r
    assert loss.relaunch_nodes() == [loss.training[0]], loss.relaunch_nodes()
    done = loss.steps_done()
    # every step by ranks 0-1 (they went on); ranks 2-3 died with their node and never ran again: no step of theirs
    # twice (the restart's failed_step is rank 0's last heartbeat, which lags: CI saw rank 2 reach 63 for 61)
    assert {(str(s), str(rk)) for s in range(1, loss.steps + 1) for rk in range(2)} <= set(done), sorted(done)[:5]
    assert all(n == 1 for (_s, rk), n in done.items() if rk in ("2", "3")), done
    again = sorted({int(s) for (s, rk), n in done.items() if n > 1})
    assert all(s > r["resume_step"] for s in again), (again, r)
    print(f"\n[measured] node {loss.dead} killed at step >= 60 under 2 nodes x 2 ranks, --min-nodes 1: training "
          f"again on {loss.training[0]} alone (world size 2) {loss.back_after(r['resume_step']):.1f} s later; "
          f"{len(again)} steps computed again")


def test_a_node_killed_under_one_task_of_an_array_spread_over_nodes_reruns_that_task_alone(orch, cleanup, nodes_back,
                                                                                           tmp_path):
    """A sweep's array of one-node tasks, one per node (2 CPUs each: a whole node). The node under one task dies
    with everything on it, the task's wrapper included (a one-node job has no survivor to report). Slurm ends that
    task NODE_FAIL and requeues it; it reruns on a healthy node once one is free and resumes from its last commit.
    orch counts one node_fail restart for that task only (no preemption, nothing against --max-attempts); every
    task ends verified, and the others ran once."""
    steps = 300
    logs = tmp_path / "steps"
    logs.mkdir()
    p = orch("sweep", "--name", "ar", "--backend", "slurm", "--partition", "multi", "--cpus-per-task", "2",
             "--mem", "1G", "--max-attempts", "1", "--grid", "seed=0,1,2", "--", *LOOP[:3], str(steps), *LOOP[4:],
             "--seed", "{seed}", "--step-log", f"{logs}/{{seed}}.log")
    assert p.returncode == 0, p.stdout + p.stderr
    tasks = {r["name"]: r for r in orch.json("status") if r.get("sweep") == "ar"}
    assert len(tasks) == 3, tasks

    def where() -> dict[str, str] | None:
        out = {}
        for name, r in tasks.items():
            nodes = run("squeue", "-h", "-j", r["external_id"], "-o", "%N|%T").stdout.strip()
            node, _, state = nodes.partition("|")
            if state != "RUNNING" or (protocol.read_progress(orch.runs / name, 1) or {}).get("step", 0) < 60:
                return None
            out[name] = node
        return out

    nodes = wait_for(where, 240, "every task running past step 60, one per node")
    assert sorted(nodes.values()) == ["n2", "n3", "vm"], nodes  # spread over the nodes
    victim = next(name for name, node in nodes.items() if node == "n3")
    assert kill_node("n3")
    wait_for(lambda: all(settled(orch, name) for name in tasks), 420, "every task to end", interval=1,
             detail=lambda: run("sacct", "-X", "-n", "-P", "--duplicates", "-j",
                                tasks[victim]["external_id"], "-o", "State,NodeList").stdout)
    for name, r in tasks.items():
        show = orch.show(name)
        assert show["state"] == "done_marker_verified", show
        (a,) = show["attempts"]
        runs = [x.split("|") for x in run("sacct", "-X", "-n", "-P", "--duplicates", "-j", r["external_id"], "-o",
                                          "State,NodeList").stdout.split()]
        if name != victim:
            assert (a["restarts"], [s for s, _ in runs]) == (0, ["COMPLETED"]), (name, a, runs)
            continue
        assert [s for s, _ in runs] == ["NODE_FAIL", "COMPLETED"] and runs[1][1] != "n3", runs
        assert (a["restarts"], [h["class"] for h in a["restart_history"]]) == (1, ["node_fail"]), a
        assert show["preemptions"]["total"] == 0, show["preemptions"]
        seed = int(name.rsplit(".", 1)[-1])  # task i of the grid seed=0,1,2
        done = Counter(int(line.split()[1]) for line in (logs / f"{seed}.log").read_text().splitlines())
        assert set(done) == set(range(1, steps + 1)), sorted(done)[:5]
        resumed = next(b["resumed_from"] for b in (json.loads(x) for x in (orch.runs / name / "attempts" / "1" /
                       protocol.PROGRESS_HISTORY).read_text().splitlines()) if b.get("resumed_from"))
        again = sorted(s for s, n in done.items() if n > 1)
        assert all(s > resumed for s in again), (resumed, again)  # nothing committed was computed twice
        print(f"\n[measured] n3 killed under task {name} at step >= 60: NODE_FAIL, rerun on {runs[1][1]}, resumed "
              f"from {resumed}; {len(again)} steps computed again; the other tasks ran once")
