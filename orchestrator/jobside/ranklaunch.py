"""Multi-rank launch (``--nproc-per-node K [--nodes N]``): the command that starts the program once per rank.

torchrun itself (``python -m torch.distributed.run``) is the engine, so every rank gets torchrun's own
environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and an unchanged
torchrun script runs as it would under torchrun. orch's job wrapper stays the one process that decides how
the attempt ended (exit.json, done.json); torchrun sits below it:

* locally:  wrapper -> ``torchrun --standalone --nproc-per-node K`` -> K ranks;
* on Slurm: wrapper (the batch process, on the first node) -> ``srun --nodes N --ntasks-per-node=1`` ->
  one torchrun per node -> K ranks each, with c10d rendezvous on the first node of the allocation
  (``scontrol show hostnames $SLURM_JOB_NODELIST | head -1``) at a port derived from the job id.

torchrun waits a fixed 30 s between the SIGTERM it passes to its workers and their SIGKILL unless told
(pytorch #119856); ``--shutdown-timeout`` (torch >= 2.10, read in torch/distributed/run.py) is set to the
job's grace, so torchrun never cuts a checkpoint short before orch or the scheduler would.

Stdlib only: the wrapper imports it on the compute node.
"""

from __future__ import annotations

import math
import subprocess
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

TORCHRUN = ("-m", "torch.distributed.run")
# torchrun forwards these to its workers (and then waits the shutdown timeout); its default lacks SIGUSR1/2,
# and SIGUSR2 is the time-limit warning a program may opt into: its default action would kill torchrun.
SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
RDZV_PORT_BASE, RDZV_PORT_SPAN = 20000, 10000  # below Linux's ephemeral range (32768-60999)
DEFAULT_GRACE_S = 60.0  # orch's own SIGTERM -> SIGKILL for a stop (observe.STOP_GRACE_S)
SCONTROL_TIMEOUT_S = 30.0


class RankLaunchError(RuntimeError):
    """The rank command cannot be composed (the allocation's node list could not be read)."""


@dataclass(frozen=True)
class RankLayout:
    """How many ranks the program runs as, and the grace torchrun gives them after a stop signal."""

    nodes: int = 1
    nproc_per_node: int = 1
    grace_s: float = DEFAULT_GRACE_S

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node


def shutdown_timeout(grace_s: float) -> int:
    """torchrun takes whole seconds; round up so the grace is never shortened."""
    return max(1, math.ceil(grace_s))


def torchrun_argv(python: str, r: RankLayout, command: Sequence[str], rdzv: tuple[str, int, str] | None = None,
                  log_dir: str | None = None) -> list[str]:
    """torchrun running ``command`` (any executable: ``--no-python``) as ``r.nproc_per_node`` local ranks.

    ``rdzv``: (host, port, id) of the c10d rendezvous of a multi-node job; None: ``--standalone`` (one node).
    ``log_dir``: torchrun's own files (the ranks' error records) go there, in the attempt's dir: without it
    torchrun makes a /tmp/torchelastic_* dir per attempt that nothing removes (hostile test: outside ORCH_HOME).
    """
    argv = [python, *TORCHRUN, "--nnodes", str(r.nodes), "--nproc-per-node", str(r.nproc_per_node),
            "--max-restarts", "0",  # a failed rank fails the attempt: orch's policy decides the retry
            "--shutdown-timeout", str(shutdown_timeout(r.grace_s)), "--signals-to-handle", SIGNALS_TO_HANDLE]
    if log_dir is not None:
        argv += ["--log-dir", log_dir]
    if rdzv is None:
        argv.append("--standalone")
    else:
        host, port, rid = rdzv
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{host}:{port}", "--rdzv-id", rid]
    return [*argv, "--no-python", "--", *command]


def recorded(python: str, ends_dir: str, launch: str, command: Sequence[str]) -> list[str]:
    """``command`` under orch's per-rank parent (orchestrator/jobside/rankend.py), which records how this rank's program
    ended (``<ends_dir>/rank-end.<launch>.<RANK>.json``) and then ends as it did."""
    return [python, "-m", "orchestrator.jobside.rankend", "--dir", ends_dir, "--launch", launch, "--", *command]


def rdzv_port(job_id: str) -> int:
    """The rendezvous port of a Slurm job: a function of its id (every node computes the same one, and two
    jobs sharing a first node rarely collide), the same again after an in-place requeue."""
    return RDZV_PORT_BASE + zlib.crc32(job_id.encode()) % RDZV_PORT_SPAN


LOST_NODE_STATES = ("down", "drain", "fail", "maint", "unk")  # sinfo %t prefixes of a node that cannot run a step


def lost_nodes(hosts: Sequence[str]) -> list[str] | None:
    """Of ``hosts``, those Slurm says cannot run a step now (down, drained, failing, or not responding: a ``*``
    suffix); None when sinfo cannot be asked."""
    if not hosts:
        return []
    try:
        p = subprocess.run(["sinfo", "-h", "-N", "-n", ",".join(hosts), "-o", "%N|%t"], capture_output=True,
                           text=True, timeout=SCONTROL_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    lost = set()
    for line in p.stdout.splitlines():
        node, _, state = line.strip().partition("|")
        if node in hosts and (state.endswith("*") or state.startswith(LOST_NODE_STATES)):
            lost.add(node)
    return sorted(lost)


def slurm_hosts(nodelist: str) -> list[str]:
    """``scontrol show hostnames NODELIST``: the allocation's hosts, in Slurm's order."""
    try:
        p = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                           timeout=SCONTROL_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RankLaunchError(f"scontrol show hostnames {nodelist}: {e}") from None
    hosts = [h.strip() for h in p.stdout.splitlines() if h.strip()]
    if p.returncode != 0 or not hosts:
        raise RankLaunchError(f"scontrol show hostnames {nodelist} failed ({p.returncode}): "
                              f"{(p.stderr or '').strip()[:200]}")
    return hosts


def slurm_step_argv(python: str, r: RankLayout, command: Sequence[str], env: Mapping[str, str],
                    log_dir: str | None = None, relaunch: int = 0, avoid: Sequence[str] = (),
                    spare: int = 0, min_nodes: int = 0) -> tuple[list[str], RankLayout]:
    """srun starting one torchrun per node of the allocation, rendezvous on its first node.

    ``--cpus-per-task`` is passed on explicitly: srun of Slurm 22.05 does not inherit the batch job's.
    ``relaunch``: the k-th rank restart in this allocation (rankrestart.py) rendezvous under an id and port of its
    own, never the failed launch's (whose store may still be closing). ``spare``: the allocation holds that many
    nodes beyond ``r.nodes``; the step then names its nodes (``--nodelist``): the allocation's first ``r.nodes``
    not in ``avoid`` (nodes lost under an earlier launch), and the rendezvous is on the first of them.
    ``min_nodes``: with fewer usable nodes than ``r.nodes`` left, the ranks go on with those, down to this many
    (a smaller world size). Returns the argv and the layout it launches.
    """
    job_id = env.get("SLURM_JOB_ID") or ""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    if not job_id or not nodelist:
        raise RankLaunchError("not inside a Slurm allocation (no SLURM_JOB_ID / SLURM_JOB_NODELIST)")
    hosts = slurm_hosts(nodelist)
    chosen = [h for h in hosts if h not in set(avoid)][:r.nodes]
    need = min(r.nodes, min_nodes or r.nodes)  # r.nodes >= 1
    if len(chosen) < need:
        raise RankLaunchError(f"{len(chosen)} usable node(s) of the allocation ({','.join(hosts)}; lost: "
                              f"{','.join(avoid) or 'none'}), the ranks need {need}")
    r = replace(r, nodes=len(chosen))
    master = chosen[0]
    srun = ["srun", f"--nodes={r.nodes}", f"--ntasks={r.nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if spare or avoid:
        srun.append(f"--nodelist={','.join(chosen)}")
    if relaunch:
        # The failed step may hold its CPUs until its lost node is gone for good ("step creation temporarily
        # disabled ... Requested nodes are busy", measured on 22.05 after a node's death): the new one shares them.
        srun.append("--overlap")
    cpus = env.get("SLURM_CPUS_PER_TASK") or ""
    if cpus.isdigit():
        srun.append(f"--cpus-per-task={cpus}")
    rid = job_id if not relaunch else f"{job_id}-r{relaunch}"
    return srun + torchrun_argv(python, r, command, rdzv=(master, rdzv_port(rid), rid), log_dir=log_dir), r
