#!/usr/bin/env python3
"""A 2-node job's rank or node killed on the dev Slurm cluster -> training again: recovered inside the allocation
against the requeue, in one run, with each finished job's goodput (issue 31).

A 2-node job (one rank per node, the plain-loop example with DDP over gloo, a commit every 50 steps, 0.05 s of sleep
per step, 300 steps) on the ``multi`` partition. Past step 60 one failure is injected into the second node the ranks
train on:

* **a rank**: its program SIGKILLed (what an ECC error or a kill -9 does); the node lives.
  - requeue: ``--nodes 2``. The job step fails, the attempt ends ``killed``, a reconcile pass (every 0.5 s, no
    backoff: its best case) submits the next attempt, a new Slurm job through the queue.
  - in the allocation: ``--rank-restarts 1``. The wrapper starts a new job step in the same allocation.
* **a node**: killed as a power loss does it: its slurmd and every process in its ``slurm_<node>`` cgroups SIGKILLed,
  no signal first (``cluster.sh kill NODE``, as the tests do). The cluster runs with ``SlurmdTimeout=20`` for these
  trials (Slurm's 300 s would dominate both paths), and ``cluster.sh up`` brings the node back after each.
  - requeue: ``--nodes 2``. srun holds the step until slurmctld declares the node down; the run ends ``NODE_FAIL``
    and Slurm requeues the job in place onto two healthy nodes (the third node is idle: nothing else waits).
  - in the allocation: ``--nodes 2 --spare-nodes 1 --rank-restarts 1``. The allocation holds 3 nodes
    (``--no-kill``); the wrapper restarts the ranks on the two left.

Timed from the kill to the first heartbeat of a step past the step the ranks resumed from (``progress.jsonl``,
beating every 0.2 s). On a busy cluster every requeue also waits in the queue, which this idle cluster does not show.

Usage: ``.venv/bin/python bench/bench_failures_slurm.py [--trials N] [--no-write]`` (the dev cluster up).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common as C
import bench_rank_restart as R

from orchestrator import protocol

TITLE = "A 2-node job's rank or node killed -> training again: in the allocation vs requeue (issue 31)"
LOOP = C.ROOT / "examples" / "plain_loop.py"
CLUSTER_SH = C.ROOT / "deploy" / "slurm" / "cluster.sh"
KILL_AT_STEP = 60
SLURMD_TIMEOUT_S = "20"


def cluster_up(short_timeout: bool) -> None:
    env = {**os.environ, **({"ORCH_SLURM_SLURMD_TIMEOUT_S": SLURMD_TIMEOUT_S} if short_timeout else {})}
    p = subprocess.run(["bash", str(CLUSTER_SH), "up"], capture_output=True, text=True, timeout=600, env=env,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"cluster.sh up: {p.stdout[-2000:]}{p.stderr[-2000:]}")


def kill_node(node: str) -> None:
    p = subprocess.run(["bash", str(CLUSTER_SH), "kill", node], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"cluster.sh kill {node}: {p.stderr.strip()}")


def _hosts(nodelist: str) -> list[str]:
    p = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    return p.stdout.split()


@dataclass
class Trial:
    took_s: float  # the kill -> the first step past the resume step
    goodput: float  # useful / held, as orch show splits the finished job
    lost_s: float  # held, not useful
    counted: str  # orch's attempts / Slurm's in-place requeues / ranks restarted in the allocation


#: (failure, recovered in the allocation) -> the submit options that choose the path
OPTIONS = {("rank", False): [], ("rank", True): ["--rank-restarts", "1"],
           ("node", False): [], ("node", True): ["--spare-nodes", "1", "--rank-restarts", "1"]}


def trial(work: Path, failure: str, in_alloc: bool, steps: int) -> Trial:
    """One job, one rank or node killed, measured to its end."""
    home = work / f"home-{time.monotonic_ns()}"
    home.mkdir(parents=True)
    (home / "orch.toml").write_text("[policy]\ncrash_backoff_s = 0\n")
    env = R._env(home)
    name = "nl"
    p = R._orch(env, "submit", "--backend", "slurm", "--partition", "multi", "--nodes", "2", "--nproc-per-node", "1",
                *OPTIONS[failure, in_alloc], "--cpus-per-task", "1", "--mem", "1G", "--name", name, "--", C.PY,
                str(LOOP), "--max-steps", str(steps), "--save-every", "50", "--sleep-per-step", "0.05")
    if p.returncode != 0:
        raise RuntimeError(f"orch submit: {p.stdout}{p.stderr}")
    run_dir = home / "runs" / name
    R._wait(lambda: any((b.get("step") or 0) >= KILL_AT_STEP for b in R._beats(run_dir, 1)), f"step {KILL_AT_STEP}")
    first = R._beats(run_dir, 1)[0].get("resumed_from")
    if failure == "rank":
        pid = R._wait(lambda: R._rank_pid(run_dir, 1), "rank 1's pid")
        killed = time.time()
        os.kill(int(pid), signal.SIGKILL)  # type: ignore[arg-type]
    else:
        wrapper = json.loads((protocol.attempt_dir(run_dir, 1) / protocol.WRAPPER_FILE).read_text())
        named = [a.split("=", 1)[1].split(",") for a in wrapper.get("ranks_command") or []
                 if a.startswith("--nodelist=")]
        training = named[0] if named else _hosts(wrapper.get("nodes") or "")
        killed = time.time()
        kill_node(training[1])  # not the batch node (the first): with a spare, its wrapper restarts the ranks

    took = R._wait(lambda: R._back(run_dir, first, killed), "training again", env)  # a requeue needs the passes
    R._until_verified(env, name)
    shown = json.loads(R._orch(env, "show", name, "--json").stdout)
    atts = shown["attempts"]
    g = shown["goodput"]
    return Trial(float(took), float(g["goodput"]), float(g["held_s"]) - float(g["seconds"]["useful"]),  # type: ignore
                 f"{len(atts)} / {sum(a['restarts'] for a in atts)} / "
                 f"{sum(len(a.get('rank_restarts') or []) for a in atts)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    C.add_quick(ap)
    a = ap.parse_args()
    if a.quick:
        a.trials, a.no_write = 1, True
    steps = KILL_AT_STEP + (40 if a.quick else 240)
    # quick: the rank restart inside the allocation, once. The node kill (~110 s with the node's return) runs as
    # tests/slurm/test_multinode_slurm.py's spare-node test, and the requeues are the tests' business too: CI's
    # slurm stream took 33 min with both here.
    paths = [("rank", True)] if a.quick else list(OPTIONS)
    work = Path(tempfile.mkdtemp(prefix="bench-failures-"))
    res: dict[tuple[str, bool], list[Trial]] = {k: [] for k in OPTIONS}
    try:
        cluster_up(short_timeout=True)
        for _ in range(a.trials):
            for failure, in_alloc in paths:  # interleaved: every path sees the same machine
                res[failure, in_alloc].append(trial(work, failure, in_alloc, steps))
                if failure == "node":
                    cluster_up(short_timeout=True)  # the killed node back (ReturnToService=2: idle at once)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        cluster_up(short_timeout=False)  # Slurm's own SlurmdTimeout again

    def row(label: str, key: tuple[str, bool]) -> list[str]:
        ts = res[key]
        took = [t.took_s for t in ts]
        base = res[key[0], False]
        ratio = C.stats(took)[0] / C.stats([t.took_s for t in base])[0] if key[1] and base else None
        return [label, C.fmt(took, "s", 1.0, 1), ", ".join(sorted({t.counted for t in ts})),
                C.fmt([100 * t.goodput for t in ts], "%", 1.0, 1), C.fmt([t.lost_s for t in ts], "s", 1.0, 1),
                "baseline" if not key[1] else "" if ratio is None else f"{ratio:.2f}x",
                "" if ratio is None else "< 1" + C.mark(ratio < 1)]

    labels = {("rank", False): "rank 1 SIGKILLed; requeue: the attempt ends killed, a reconcile pass submits the next",
              ("rank", True): "rank 1 SIGKILLed; --rank-restarts 1: a new job step in the allocation",
              ("node", False): "node killed; requeue: NODE_FAIL, Slurm requeues the job in place",
              ("node", True): "node killed; --spare-nodes 1 --rank-restarts 1: the ranks restart on the spare"}
    rows = [row(labels[k], k) for k in OPTIONS if res[k]]
    tab = C.table([f"2 nodes x 1 rank, killed past step {KILL_AT_STEP}", "kill -> a step past the resume point",
                   "attempts / Slurm requeues / restarts in the allocation", "goodput (useful / held)",
                   "held, not useful", "ratio", "goal"], rows)
    print(tab)
    if not a.no_write:
        notes = (f"{a.trials} trials each, interleaved; median (min-max); {steps} steps, a commit every 50. "
                 "The rank's requeue is its best case: a reconcile pass every 0.5 s, no backoff, an idle queue; a "
                 "cron's minute and a busy queue add to it, not to the restart inside the allocation. "
                 f"SlurmdTimeout={SLURMD_TIMEOUT_S} for the node kills: most of either node figure is Slurm declaring "
                 "the node down, which both paths wait for; on this idle cluster the requeue starts at once on the "
                 "third node, on a busy one it waits in the queue, and the spare does not. Goodput counts the job's "
                 "held time, not its nodes, and not the gap between two attempts (not held): a requeue's wait costs "
                 "wall time, which the first column shows, more than goodput; the spare's third node is held all "
                 "along, idle, which a node-hours account would charge it.")
        C.replace_section(TITLE, C.preamble("bench_failures_slurm.py", notes) + "\n" + tab + "\n")
        print(f"wrote section '{TITLE}' of {C.BENCHMARKS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
