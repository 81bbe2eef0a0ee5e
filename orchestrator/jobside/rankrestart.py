"""Restart a multi-rank program's ranks inside the job's own allocation (``--rank-restarts K``).

A rank killed by a transient fault (an ECC error, a driver reset, a kill -9; on a cluster an NCCL abort) used to
fail the whole attempt, and the retry went back through the scheduler's queue: minutes to hours on a busy
cluster, for a fault the same allocation can recover from in seconds. torchrun's ``--max-restarts`` does this
inside one torchrun, from whatever the program saved; NVIDIA's in-job restart does it across nodes. Here the
wrapper, which already supervises the ranks (``wrapper.py``), launches them again in the same allocation, and the
program resumes from its newest verified checkpoint, as any retry would.

When, and only when, all of these hold (otherwise the attempt ends and orch's policy decides, as before):

* the ranks failed on their own: no stop reached the wrapper or was recorded by the program (a preemption or a
  cancel must end the attempt), nothing was completed, and the kernel's memory cgroup saw no OOM kill (an OOM
  repeats at the same batch size: orch's OOM policy changes it, a restart cannot);
* the evidence says transient: the rank that failed first was killed by a signal no peer's death sends (SIGKILL,
  SIGSEGV, SIGBUS: ``rankend.first_own_end``), or the program's own report names a transient class (``storage``:
  an EIO on a save; ``node_fail``). A rank that exited with an error code raised: a bug repeats, and the
  program's report of a crash, NaN, OOM or invalid input is never overridden;
* fewer than K restarts were made in this attempt, and since the previous one the program committed a newer
  checkpoint (the no-progress guard: a fault that recurs before any commit would loop for ever).

Each restart is recorded (``protocol.append_rank_restart``) before the relaunch: the failed rank, its end, the
step it reached and the step the next launch resumes from. Stdlib + protocol only (the compute node).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from orchestrator import protocol
from orchestrator.jobside import memlimit, rankend, ranklaunch
from orchestrator.jobside.supervisor import STOPS, Supervisor, stop_leftovers

# Signals no peer's death sends a rank (rankend.CONSEQUENCE_SIGNALS is the one it does) and that a relaunch can
# get past: the kernel's or a user's SIGKILL, a memory fault of a flaky device or driver.
TRANSIENT_SIGNALS = frozenset({signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS})
# What the program's own report may say for a restart to be worth it: a transient storage fault, a node lost.
TRANSIENT_CLASSES = frozenset({protocol.FailureClass.STORAGE.value, protocol.FailureClass.NODE_FAIL.value})
# What the program's report forbids: a repeat of the same fault at the same settings.
NEVER_CLASSES = frozenset(c.value for c in (
    protocol.FailureClass.OOM, protocol.FailureClass.NAN, protocol.FailureClass.CRASH,
    protocol.FailureClass.INVALID, protocol.FailureClass.INPUT_MISSING, protocol.FailureClass.ENOSPC,
    protocol.FailureClass.PREEMPTED, protocol.FailureClass.TIMEOUT, protocol.FailureClass.CANCELLED))


@dataclass(frozen=True)
class Failed:
    """How one launch of the ranks ended, as the wrapper saw it."""

    returncode: int
    stopped: bool  # a stop reached the wrapper (a preemption, a cancel, the time limit)
    completed: bool  # the program recorded its completion
    oom_kills: int  # the memory cgroup's count of OOM kills so far (0 without a cgroup)
    end: rankend.RankEnd | None  # the rank that failed on its own first, if the records tell
    report_class: str | None  # the program's failure.json class, if it wrote one
    lost_nodes: tuple[str, ...] = ()  # nodes of the allocation Slurm says were lost since the last launch began
    program_stopped: bool = False  # the program recorded a stop before its first rank's own end, none reached us


def transient_cause(f: Failed) -> str | None:
    """The failure class a restart in the allocation would recover from, or None when it must not be tried."""
    if f.returncode == 0 or f.stopped or f.completed or f.oom_kills > 0:
        return None
    if f.lost_nodes:  # a node died under the ranks: whatever the survivors reported, it was the node
        # ... and whatever stop they recorded: the lost node took the rendezvous store with it where it hosted it,
        # and each survivor's torchrun agent failed and SIGTERMed its ranks (measured on the dev cluster, 2 nodes x
        # 2 ranks, the --min-nodes test), before any rank's own end. A real stop reaches the wrapper first.
        return protocol.FailureClass.NODE_FAIL.value
    if f.program_stopped:
        return None
    if f.report_class in NEVER_CLASSES:
        return None
    if f.end is not None and f.end.signal in TRANSIENT_SIGNALS:
        return protocol.FailureClass.KILLED.value
    if f.report_class in TRANSIENT_CLASSES:
        return f.report_class
    return None


def refusal(cause: str | None, done: int, allowed: int, committed_now: int | None,
            committed_at_last: int | None) -> str | None:
    """Why the ranks are not restarted in the allocation (None: they are). ``committed_*``: the newest verified
    checkpoint's step now and when the previous restart was made (None: none)."""
    if allowed <= 0:
        return "not asked for (--rank-restarts 0)"
    if cause is None:
        return "not a transient failure"
    if done >= allowed:
        return f"the {allowed} rank restart(s) asked for were made"
    if done > 0 and (committed_now or 0) <= (committed_at_last or 0):
        return f"no checkpoint newer than step {committed_at_last or 0} since the last rank restart"
    return None


def newest_committed(run_dir: Path) -> int | None:
    """The newest committed checkpoint's step whose manifest and sizes verify (what a relaunch resumes from)."""
    for p in protocol.iter_checkpoint_dirs(run_dir):
        if protocol.verify_checkpoint(p, hashes=False) is None:
            return protocol.checkpoint_step(p)
    return None


def report_class(adir: Path) -> str | None:
    """The class in the program's failure.json of this run, if it wrote one that parses."""
    rep = protocol.read_failure_at(adir / protocol.FAILURE_FILE)
    return None if rep is None else str(rep["class"])


def stopped_by_its_end(stop_at: str | None, end: rankend.RankEnd | None) -> bool:
    """Whether the program's stop record came after the first rank's own end: torchrun SIGTERMs the surviving
    ranks once one died, and the kit records that as a stop (seen: 30 ms after rank 1's SIGKILL). A stop recorded
    before it (a preemption, a user's SIGTERM) is the attempt's."""
    if end is None or not stop_at:
        return False
    try:
        return datetime.fromisoformat(stop_at).timestamp() >= end.at
    except (TypeError, ValueError):
        return False


def record(adir: Path, token: str, f: Failed, cause: str, failed_step: int | None, resume_step: int | None,
           at: float, lost_nodes: tuple[str, ...] = ()) -> int:
    """Move the failed launch's reports (failure.json, each rank's failure.rank-<r>.json, stop.json) to
    ``rank-restarts/<k>/`` (the next launch's must not be read as its: a survivor takes a peer's failure record
    as its cause) and add the restart to ``rank_restarts.json``; returns how many restarts the attempt made."""
    k = len(protocol.read_rank_restarts(adir, token)) + 1
    try:  # a rank-restarts/ the job planted as a symlink would take the reports out of the run dir: refused
        aside = protocol.resolve_inside(adir, f"{protocol.RANK_RESTARTS_DIR}/{k}")
    except protocol.UnsafePath:
        aside = None
    reports = [adir / protocol.FAILURE_FILE, adir / protocol.STOP_FILE, *protocol.rank_failures(adir)]
    for src in reports:
        if not (src.exists() or src.is_symlink()):
            continue
        if aside is None:
            src.unlink()  # never read as the next launch's; the record below keeps what it said
            continue
        aside.mkdir(parents=True, exist_ok=True)
        os.replace(src, aside / src.name)
    return protocol.append_rank_restart(adir, token, {
        "at": at, "class": cause, "failed_step": failed_step, "resume_step": resume_step,
        "lost_nodes": list(lost_nodes),
        "failed_rank": None if f.end is None else f.end.rank,
        "rank_returncode": None if f.end is None else f.end.returncode})


@dataclass(frozen=True)
class Launch:
    """The wrapper's launch of the ranks that just ended, and what a relaunch needs."""

    token: str
    attempt: int
    allowed: int  # --rank-restarts
    run_dir: Path
    adir: Path
    ends_dir: Path  # attempts/<n>/torchrun: each rank's end record
    world_size: int
    launch: str  # the ended launch's id (its rank end records carry it)
    # (new launch id, restart k, nodes to avoid) -> (argv, the world size it launches)
    compose: Callable[[str, int, tuple[str, ...]], tuple[list[str], int | None]]
    # SLURM_JOB_NODELIST of a job that outlives a lost node (--spare-nodes, --min-nodes): the node is replaced, or left
    allocation: str | None = None


def relaunch(ln: Launch, rc: int, env: dict[str, str], sup: Supervisor, cgroup: memlimit.MemCgroup | None,
             out: BinaryIO, err: BinaryIO, deadline: float | None
             ) -> tuple[str, list[str], subprocess.Popen, int] | None:
    """After the ranks' launch ended with ``rc``: launch them again in this allocation when the failure was
    transient and ``--rank-restarts`` allows, as (launch id, argv, child, world size); None ends the attempt.

    Stops are held from the decision to the new child's start: one that arrives meanwhile either ends the
    attempt here (it was pending at the decision) or reaches the new child once released (the handler signals
    ``sup.child``), never nobody."""
    if not ln.allowed or rc == 0:
        return None
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        end = rankend.first_own_end(rankend.read_rank_ends(ln.ends_dir, ln.launch, ln.token, ln.world_size),
                                    ln.world_size)
        stop = protocol.read_stop(ln.adir, ln.token)
        stopped = sup.stop_signal is not None or bool(signal.sigpending() & STOPS)
        before = protocol.read_rank_restarts(ln.adir, ln.token)
        lost_before = {n for r in before for n in r["lost_nodes"]}
        lost_now = _lost_nodes(ln.allocation)
        f = Failed(returncode=rc, stopped=stopped, completed=protocol.read_completion(ln.adir, ln.token) is not None,
                   oom_kills=(cgroup.oom_kills() or 0) if cgroup else 0, end=end, report_class=report_class(ln.adir),
                   lost_nodes=tuple(n for n in lost_now if n not in lost_before),
                   program_stopped=stop is not None and not stopped_by_its_end(stop.at, end))
        cause = transient_cause(f)
        committed = newest_committed(ln.run_dir)
        why = refusal(cause, len(before), ln.allowed, committed, before[-1]["resume_step"] if before else None)
        if why is None and deadline is not None and time.monotonic() >= deadline:
            why = "the time limit was reached"
        if why is not None or cause is None:
            if cause is not None:
                err.write(f"orch wrapper: the ranks are not restarted in the allocation: {why}\n".encode())
            return None
        stop_leftovers(token=ln.token)  # nothing of the failed launch runs beside the next one
        step = (protocol.read_progress(ln.run_dir, ln.attempt) or {}).get("step")
        avoid = tuple(sorted(lost_before | set(lost_now)))
        k = record(ln.adir, ln.token, f, cause, step if protocol.is_int(step, 0, 10**15) else None, committed,
                   time.time(), avoid)
        resume_env(ln.run_dir, ln.attempt, env)
        launch = os.urandom(6).hex()
        try:
            argv, launched = ln.compose(launch, k, avoid)
        except RuntimeError as e:  # ranklaunch.RankLaunchError: fewer usable nodes than the ranks need
            err.write(f"orch wrapper: cannot launch the ranks again: {e}\n".encode())
            return None
        err.write(f"orch wrapper: rank restart {k}/{ln.allowed} in the allocation ({cause}"
                  f"{'' if end is None else f', rank {end.rank} ended {end.returncode}'}); resuming from "
                  f"step {committed or 0}\n".encode())
        err.flush()
        try:
            child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                     cwd=str(ln.run_dir), preexec_fn=cgroup.join_self if cgroup else None)
        except OSError as e:
            err.write(f"orch wrapper: cannot start {argv[0]!r} again: {e}\n".encode())
            return None
        sup.child = child  # every stop from now on reaches the new launch (a cancel left the relaunched ranks running)
        world_size = launched or ln.world_size
        _rewrite_wrapper_record(ln.adir, child, argv, launch, k, world_size)
        return launch, argv, child, world_size
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)


def _lost_nodes(allocation: str | None) -> list[str]:
    """The allocation's nodes Slurm says are lost now ([] without spare nodes, or when Slurm cannot be asked: then
    a node's death is not told apart, and the attempt ends as before)."""
    if not allocation:
        return []
    try:
        return ranklaunch.lost_nodes(ranklaunch.slurm_hosts(allocation)) or []
    except ranklaunch.RankLaunchError:
        return []


def resume_env(run_dir: Path, attempt: int, env: dict[str, str]) -> None:
    """The relaunch resumes from the newest commit: a rollback target the policy gave the attempt (``resume`` in
    the overrides) was this attempt's start, and would throw away what the ranks committed since."""
    try:
        overrides = json.loads(env.get(protocol.ENV_OVERRIDES) or "{}")
    except ValueError:
        overrides = {}
    if not isinstance(overrides, dict):
        overrides = {}
    if "resume" in overrides:
        overrides.pop("resume")
        env[protocol.ENV_OVERRIDES] = json.dumps(overrides, sort_keys=True)
    env.pop(protocol.ENV_RESUME_STEP, None)
    try:
        resume = protocol.expected_resume_step(run_dir, attempt, overrides)
    except (OSError, ValueError):
        resume = None
    if resume is not None:
        env[protocol.ENV_RESUME_STEP] = str(resume)


def _rewrite_wrapper_record(adir: Path, child: subprocess.Popen, argv: list[str], launch: str, k: int,
                            world_size: int) -> None:
    """wrapper.json names the running launch and its world size (a rank end is read by them when no exit.json
    comes); the run's start stays the first launch's (goodput's)."""
    try:
        w = protocol.read_json_bounded(adir / protocol.WRAPPER_FILE, limit=1 << 16)
        if isinstance(w, dict):
            protocol.atomic_write_json(adir / protocol.WRAPPER_FILE, {
                **w, "child_pid": child.pid, "ranks_command": argv, "launch": launch, "rank_restarts": k,
                "world_size": world_size})
    except (OSError, ValueError):
        pass  # informative only
