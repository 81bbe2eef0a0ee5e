"""Helpers of the real-Slurm tests (the fixtures in conftest.py use them; tests import them)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.backends.base import AttemptRef, Outcome, Phase, Resources, SubmitSpec
from orchestrator.backends.slurm import SlurmBackend

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SH = ROOT / "deploy" / "slurm" / "cluster.sh"
STATE = Path(os.environ.get("ORCH_SLURM_STATE", "/var/lib/orch-slurm"))
from orchkit import IN_CI, wait_for  # noqa: E402,F401 - the one reading of CI=true


def cluster_status() -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CLUSTER_SH), "status"], capture_output=True, text=True, timeout=60)


def cluster_up() -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CLUSTER_SH), "up"], capture_output=True, text=True, timeout=600)


def run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)


def cluster_up_with(**env: str) -> None:
    """``cluster.sh up`` with these settings (``ORCH_SLURM_SLURMD_TIMEOUT_S="20"``): a changed slurm.conf restarts
    the daemons. ``cluster_up_with()`` puts the defaults back, and any node a test killed with them."""
    p = subprocess.run(["bash", str(CLUSTER_SH), "up"], capture_output=True, text=True, timeout=600,
                       env={**os.environ, **env})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def kill_node(node: str) -> bool:
    """A power loss's stand-in for one dev-cluster node (``cluster.sh kill NODE``): SIGKILL to its slurmd and to every
    process in its ``slurm_<node>`` memory cgroups (the job's steps on it), no signal to the job first. True when
    something was killed."""
    p = subprocess.run(["bash", str(CLUSTER_SH), "kill", node], capture_output=True, text=True, timeout=60)
    return p.returncode == 0


@dataclass
class SlurmKit:
    """The backend under test plus the bookkeeping that keeps tests from disturbing each other."""

    tmp: Path
    backend: SlurmBackend = field(default_factory=SlurmBackend)
    job_ids: list[str] = field(default_factory=list)

    def spec(self, name: str, command: Sequence[str], *, partition: str = "spot", cpus: int = 1,
             mem_mb: int | None = 300, time_s: int | None = None, env: dict | None = None,
             attempt: int = 1, warning_signal: str = "TERM") -> SubmitSpec:
        run_dir = self.tmp / "runs" / name
        run_dir.mkdir(parents=True, exist_ok=True)
        token = f"{name}-{attempt}-{os.urandom(4).hex()}"
        return SubmitSpec(job=name, attempt=attempt, token=token, run_dir=run_dir, command=tuple(command),
                          env={"PYTHONUNBUFFERED": "1", **(env or {})},
                          resources=Resources(cpus_per_task=cpus, mem_mb=mem_mb, time_s=time_s,
                                              extras={"partition": partition}), warning_signal=warning_signal)

    def submit(self, spec: SubmitSpec) -> AttemptRef:
        job_id = self.backend.submit(spec)
        self.job_ids.append(job_id)
        return AttemptRef(job_id, spec.token, spec.run_dir, spec.attempt)

    def sbatch(self, *args: str) -> str:
        """A plain Slurm job (e.g. the high-priority job that preempts ours)."""
        p = run("sbatch", "--parsable", "-o", "/dev/null", *args)
        assert p.returncode == 0, p.stderr
        job_id = p.stdout.strip().split(";")[0]
        self.job_ids.append(job_id)
        return job_id

    def poll_until(self, refs: Sequence[AttemptRef], done: Callable[[dict[str, Outcome]], bool],
                   timeout: float, history: list | None = None, every: float = 0.5) -> dict[str, Outcome]:
        """Poll all refs (one backend call each time) until ``done``; keep every answer in ``history``."""
        t0 = time.monotonic()
        hist = [] if history is None else history

        def polled() -> dict[str, Outcome] | None:
            out = self.backend.poll(refs)
            hist.append((round(time.monotonic() - t0, 1),
                         {r.token: (o.phase.value, o.backend_state, o.restart_count) for r, o in
                          ((r, out.get(r.token, Outcome(Phase.UNKNOWN))) for r in refs)}))
            return out if done(out) else None

        return wait_for(polled, timeout, "the polled outcomes", interval=every,
                        detail=lambda: "history:\n" + "\n".join(map(str, hist[-40:])))

    def cleanup(self) -> None:
        if self.job_ids:
            run("scancel", *self.job_ids)


def phases(out: dict[str, Outcome], *refs: AttemptRef) -> tuple[Phase, ...]:
    return tuple(out[r.token].phase if r.token in out else Phase.UNKNOWN for r in refs)


# Pending for these reasons, a job cannot start while a test runs (a benchmark's held submissions; a job asking
# for more nodes than this one-node cluster has, as a multi-node refusal test leaves behind).
_DORMANT = {"BeginTime", "JobHeldUser", "JobHeldAdmin", "PartitionNodeLimit"}


def node_idle(timeout: float = 60) -> None:
    """Wait until no job holds the node or may start on it (a previous test's cancelled jobs are gone)."""
    def idle() -> bool:
        rows = [line.split("|") for line in run("squeue", "-h", "-o", "%i|%t|%r").stdout.split()]
        return not [r for r in rows if not (len(r) == 3 and r[1] == "PD" and r[2] in _DORMANT)]

    wait_for(idle, timeout, "the node to be free", interval=0.5, detail=lambda: run("squeue").stdout)


def submitted_since(since: str) -> set[str]:
    """The job ids (an array's one id) sacct holds as submitted at or after ``since`` (``%Y-%m-%dT%H:%M:%S``, local
    time). ``sacct -S`` alone also lists a previous test's job that ended after ``since``: once the tests' orch runs
    got faster, a job cancelled by the test before ended within that second and counted as a second sbatch."""
    acct = run("sacct", "-X", "-n", "-P", "--duplicates", "-S", since, "-o", "JobID,Submit").stdout
    return {job.split("_")[0] for job, submit in (line.split("|") for line in acct.split()) if submit >= since}


def cancel_all_of(orch, extra: Sequence[str] = ()) -> None:
    """scancel every Slurm job of the test's orch jobs (and ``extra`` ids): a test's teardown. Never raises past
    a failing status query, so the test's own failure is the one reported."""
    ids = list(extra)
    try:
        for row in orch.json("status"):
            ids += [a["external_id"] for a in orch.show(row["name"])["attempts"] if a.get("external_id")]
    except Exception:  # cleanup must not hide the test's own failure
        pass
    if ids:
        run("scancel", *ids)


def start_requeued(ours: Callable[[str, str], bool]) -> None:
    """Jobs Slurm requeued in place wait for their BeginTime (~2 min by default); an admin (root here) may start
    them now. Only the wait is skipped: Slurm's own requeue is what is under test. ``ours(job id, job name)``
    picks the test's own jobs."""
    for line in run("squeue", "-h", "-r", "-t", "PD", "-o", "%i|%r|%j").stdout.splitlines():
        jid, reason, name = (line.split("|") + ["", ""])[:3]
        if reason.strip() == "BeginTime" and ours(jid, name):
            run("scontrol", "update", f"jobid={jid}", "StartTime=now")


# A program that records its runs and the signals it gets in events.jsonl (in its run dir, its cwd).
# First run (SLURM_RESTART_COUNT unset or 0): waits for a signal, then exits 143 (what a trainer does
# after checkpointing). A rerun after an in-place requeue: exits 0 at once.
SIGNALLED = r'''
import json, os, signal, sys, time
RESTART = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
IGNORE = os.environ.get("IGNORE_SIGNALS", "").split(",")
def log(**kw):
    with open("events.jsonl", "a") as f:
        f.write(json.dumps({"t": time.time(), "restart": RESTART, **kw}) + "\n")
def handler(signum, _frame):
    log(event="signal", sig=signal.Signals(signum).name)
    if signal.Signals(signum).name not in IGNORE:
        # Slurm signals every process of the job and orch's wrapper forwards the same signal: a
        # second SIGTERM during interpreter shutdown would kill us by the signal instead of exit 143.
        for s in (signal.SIGTERM, signal.SIGUSR2):
            signal.signal(s, signal.SIG_IGN)
        sys.exit(143)
for s in (signal.SIGTERM, signal.SIGUSR2):
    signal.signal(s, handler)
log(event="start", job=os.environ.get("SLURM_JOB_ID"), attempt=os.environ.get("ORCH_ATTEMPT"))
if RESTART > 0:
    sys.exit(0)
for _ in range(600):
    time.sleep(0.5)
'''


def events(run_dir: Path) -> list[dict]:
    p = run_dir / "events.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def wait_started(run_dir: Path, timeout: float = 60) -> dict:
    def started() -> dict | None:
        return next((e for e in events(run_dir) if e["event"] == "start"), None)

    return wait_for(started, timeout, f"{run_dir.name} to start", interval=0.3, detail=lambda: run("squeue").stdout)
