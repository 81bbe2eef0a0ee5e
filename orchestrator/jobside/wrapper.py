"""orch's job wrapper: runs one attempt of a user's command and records how it ended.

Run as ``python -m orchestrator.jobside.wrapper --run-dir D --job J --attempt N --token T [--outputs G]... -- CMD``
on the compute node (Slurm: it IS the batch process) or detached in its own session on this
machine (local backend). Stdlib + protocol only, so it starts fast in any environment.

What it guarantees:
- the command's stdout/stderr land in the attempt dir; the command gets ORCH_* and tracker ids;
- a stop reaches the program once: under Slurm, Slurm signals every process itself and the wrapper
  only notes it; locally, the wrapper passes a SIGTERM it receives (orch cancel, a hang stop) to the
  program and, at a time limit, sends SIGTERM then SIGKILL after a grace, as Slurm would;
- the scheduler's early warning (``--signal=B:USR2``, sent to the batch process only) reaches the
  program as the signal it handles: SIGTERM unless the program opted into SIGUSR2 (a
  program without a USR2 handler died of orch's own warning);
- when the program ends, what it left running in the job's session is stopped (as Slurm ends a job
  with its batch script), so "the job is alive" and "the program is alive" mean the same;
- with ``--spot-notice``, a cloud's spot interruption notice (``orchestrator/jobside/spotnotice.py``) reaches
  the program as the SIGTERM of a preemption, minutes before the VM goes;
- fencing: with ``--fence G``, the program runs only if ``attempts/<n>/fence.json`` (written by the
  launcher that won the claim, before its backend call) still names generation G; a wrapper of a
  launcher that lost its claim exits without running it, writes ``superseded.json`` (never exit.json,
  which belongs to the current launch) and says why. A Slurm in-place requeue reruns the same wrapper
  with the same fence, so it runs again;
- ``exit.json`` records the exit status and any stop delivered;
- done.json is written by this wrapper, after the program exited, and only when the exit is 0, no stop
  signal reached the wrapper or was recorded by the program (``attempts/<n>/stop.json``), the disk did
  not fill, and the program's kit recorded completion (``attempts/<n>/complete.json`` of this token) or
  ``--outputs`` were given. It lists, at that moment, everything under ``result/``, the record's outputs
  and the ``--outputs`` matches (a callback's done.json, written when fit ended, verified a
  script whose export then raised; a program that exits 0 after SIGTERM was verified). A
  done.json the program wrote itself and then exited non-zero or was stopped is set aside
  (``done.rejected-<k>.json``), never verified. Stop signals are blocked from the program's exit until
  exit.json is written, and any that arrived meanwhile undo the marker: no TERM is ever followed by one;
- multi-rank (``--nproc-per-node K [--nodes N]``): the wrapper runs the command once per rank through
  torchrun (``orchestrator/jobside/ranklaunch.py``) and stays the one process that records the attempt's end. Locally
  torchrun is its child and gets every stop as above; torchrun starts its workers in sessions of their own,
  so what carries the attempt's token in its environment is stopped with the job's session. Under Slurm
  the ranks run in a job step (srun, one torchrun per node): a stop of the wrapper's own (the warning, a spot
  notice) goes to every step of the job on every node as ``scancel --signal`` (a SIGTERM to srun itself
  SIGKILLs the step, measured), and after a preemption's grace-start SIGTERM ended the step, the wrapper
  waits for Slurm's own signal at the end of the grace, so Slurm requeues the job in place (a batch
  script that exits during the grace ends FAILED, not requeued, measured on 22.05). Each rank's program runs
  under ``orchestrator/jobside/rankend.py``, which records its own end: when torchrun fails (it exits 1 whatever a rank
  died of), exit.json names the rank that failed on its own first (``failed_rank``, ``rank_returncode``).
"""

from __future__ import annotations

import argparse
import errno
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

from orchestrator import protocol, testhooks
from orchestrator.jobside import memlimit, mlflowrun, rankend, ranklaunch, rankrestart, spotnotice, trackerlock
from orchestrator.jobside.ballast import Ballast, give_back
from orchestrator.jobside.cmdline import parse_with_command
from orchestrator.jobside.stoppedwatch import StoppedWatch
from orchestrator.jobside.supervisor import STOPS, Supervisor, stop_leftovers

FORWARDED = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT, signal.SIGUSR1)
WRAPPER_FILE = protocol.WRAPPER_FILE  # back-compat name


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="orchestrator.jobside.wrapper")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--attempt", type=int, required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--fence", type=int, default=None,
                    help="the launch claim's generation: run only while attempts/<n>/fence.json names it")
    ap.add_argument("--batch", default=None,
                    help="the group launch that left this attempt's records in its batch dir (with --task)")
    ap.add_argument("--task", type=int, default=None, help="this attempt's index in --batch")
    ap.add_argument("--outputs", action="append", default=[])
    ap.add_argument("--warning-signal", choices=("TERM", "USR2", "INT"), default="TERM",
                    help="what the program gets when the scheduler warns of the time limit (SIGUSR2 to us)")
    ap.add_argument("--umask", default="0077", help="octal umask for the program and every file written")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="seconds; SIGTERM then, SIGKILL after --kill-grace (the local backend's time limit)")
    ap.add_argument("--kill-grace", type=float, default=30.0)
    ap.add_argument("--spot-notice", choices=("auto", *spotnotice.PROVIDERS), default=None,
                    help="watch this cloud's metadata endpoint for a spot interruption notice (default: off)")
    ap.add_argument("--spot-url", default=None, help="the metadata endpoint's base URL")
    ap.add_argument("--spot-interval", type=float, default=5.0, help="seconds between polls")
    ap.add_argument("--nproc-per-node", type=int, default=None,
                    help="run the command as this many ranks per node under torchrun (ranklaunch.py)")
    ap.add_argument("--nodes", type=int, default=1, help="nodes of a multi-rank job (Slurm: one torchrun each)")
    ap.add_argument("--grace", type=float, default=ranklaunch.DEFAULT_GRACE_S,
                    help="seconds torchrun gives the ranks between a stop signal and SIGKILL (--shutdown-timeout)")
    ap.add_argument("--rank-restarts", type=int, default=0,
                    help="restart a multi-rank program's ranks in this allocation up to this many times after a "
                         "transient rank failure (rankrestart.py)")
    ap.add_argument("--spare-nodes", type=int, default=0,
                    help="the allocation holds this many nodes beyond --nodes: a rank restart replaces a lost node")
    ap.add_argument("--min-nodes", type=int, default=0, help="a rank restart may go on with this many nodes, or more")
    ap.add_argument("--mem-mb", type=int, default=None,
                    help="run the program in a memory cgroup with this limit (local backend; memlimit.py)")
    a = parse_with_command(ap, argv)
    if not 0.05 <= a.spot_interval <= 86400:  # also refuses nan
        ap.error(f"--spot-interval {a.spot_interval} is not 0.05..86400 seconds")
    if not 0 <= a.rank_restarts <= protocol.MAX_RANK_RESTARTS or not 0 <= a.spare_nodes <= 100 \
            or not 0 <= a.min_nodes <= 100_000:
        ap.error(f"--rank-restarts {a.rank_restarts} --spare-nodes {a.spare_nodes} --min-nodes {a.min_nodes}: "
                 "out of range")
    if (a.nproc_per_node is not None and a.nproc_per_node < 1) or a.nodes < 1 or not 0 < a.grace <= 10**7:
        ap.error(f"--nproc-per-node {a.nproc_per_node} --nodes {a.nodes} --grace {a.grace}: need K, N >= 1, grace > 0")
    return a


def write_outputs_marker(run_dir: Path, job: str, attempt: int, patterns: list[str],
                         ballast: Ballast) -> str | None:
    """Write done.json over the files matching ``patterns`` (relative to the run dir); None or why not."""
    rels: set[str] = set()
    for pat in patterns:
        for hit in glob.glob(pat, root_dir=run_dir, recursive=True):
            p = run_dir / hit
            # A late backstop behind the parse-time refusal: a glob of a job submitted before it (`**`)
            # listed attempts/<n>/exit.reserve, which changes after the marker: marker_corrupt for ever.
            if p.is_file() and not p.is_symlink() and not protocol.is_orch_owned(os.path.normpath(hit)):
                rels.add(os.path.normpath(hit))
    if not rels:
        return f"--outputs {patterns} matched no file"
    try:
        protocol.write_done_marker(run_dir, job, attempt, sorted(rels))
    except (OSError, ValueError) as e:
        # Never retried in the ballast's room: outputs written on a full disk may be truncated.
        ballast.disk_full |= getattr(e, "errno", None) == errno.ENOSPC
        return f"could not write {protocol.DONE_MARKER}: {e}"
    return None


TORCHRUN_DIR = rankend.TORCHRUN_DIR  # attempts/<n>/torchrun: torchrun's own files (each rank's error record)
TRACKER_LOCK_WAIT_S = mlflowrun.TIMEOUT_S + 5  # a mark in flight ends within its child's alarm


def _arrange_trackers(run_dir: Path, job: str, attempt: int, env: dict[str, str],
                      err: BinaryIO) -> tuple[str | None, str]:
    """``mlflowrun.arrange``, after any mark of the job's previous end still in flight (trackerlock.py): the program
    starts only once its tracker run can no longer be marked ended under it. Never blocks for good: a lock that
    stays held, or a stopped holder, is said on stderr and the attempt goes on."""
    if not (run_dir / protocol.TRACKERS_FILE).exists() and not env.get(mlflowrun.URI_ENV):
        return None, ""  # no tracker run to mark or arrange: no lock file made
    try:
        with trackerlock.held(run_dir, TRACKER_LOCK_WAIT_S):
            return mlflowrun.arrange(run_dir, job, attempt, env)
    except trackerlock.TrackerLockError as e:
        err.write(f"orch wrapper: {e}; going on without it\n".encode())
        return mlflowrun.arrange(run_dir, job, attempt, env)


def _torchrun_dir(a: argparse.Namespace) -> Path:
    """attempts/<n>/torchrun: torchrun's --log-dir, and where orch's per-rank parent records each rank's end."""
    return protocol.attempt_dir(Path(a.run_dir), a.attempt) / TORCHRUN_DIR


def _program(a: argparse.Namespace, launch: str, relaunch: int = 0,
             avoid: tuple[str, ...] = ()) -> tuple[list[str], int | None, str | None]:
    """(argv to run, the world size orch launched or None, the Slurm job whose steps run the ranks or None).

    Raises ``ranklaunch.RankLaunchError``. Without ``--nproc-per-node`` the command runs as given, a user's own
    ``torchrun ...`` included (never wrapped twice). With it, each rank's program runs under
    orchestrator/jobside/rankend.py, which records its own end under ``launch`` (a Slurm in-place rerun has another).
    """
    if not a.nproc_per_node:
        return list(a.command), None, None
    r = ranklaunch.RankLayout(a.nodes, a.nproc_per_node, max(a.grace, a.kill_grace))
    log_dir = str(_torchrun_dir(a))
    command = ranklaunch.recorded(sys.executable, log_dir, launch, a.command)
    job_id = os.environ.get("SLURM_JOB_ID")
    if job_id:
        argv, launched = ranklaunch.slurm_step_argv(sys.executable, r, command, os.environ, log_dir, relaunch=relaunch,
                                                    avoid=avoid, spare=a.spare_nodes, min_nodes=a.min_nodes)
        return argv, launched.world_size, job_id
    if a.nodes > 1:  # torchrun --standalone would wait for nodes that never come
        raise ranklaunch.RankLaunchError(f"--nodes {a.nodes} needs a Slurm allocation; this machine is one node")
    return ranklaunch.torchrun_argv(sys.executable, r, command, log_dir=log_dir), r.world_size, None


def _failed_rank(a: argparse.Namespace, launch: str, rc: int, world_size: int | None) -> dict[str, int]:
    """exit.json's failed_rank/rank_returncode: the rank whose program failed on its own first, read only when
    torchrun itself exited non-zero (a rank's record never speaks for a run torchrun called a success)."""
    if not world_size or rc <= 0:
        return {}
    end = rankend.first_own_end(rankend.read_rank_ends(_torchrun_dir(a), launch, a.token, world_size),
                                world_size)
    return {} if end is None else {"failed_rank": end.rank, "rank_returncode": end.returncode}


def _start_watcher(a: argparse.Namespace, sup: Supervisor) -> spotnotice.Watcher | None:
    """The spot notice watcher, when asked for. The program already runs: a watcher that cannot
    start costs the notice, never the attempt."""
    if not a.spot_notice:
        return None
    try:
        w = spotnotice.Watcher(a.spot_notice, sup.on_notice, base_url=a.spot_url or spotnotice.DEFAULT_URL,
                               interval_s=a.spot_interval)
        w.start()
    except Exception as e:
        print(f"orch wrapper: spot notices: not watching: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return None
    return w


def main(argv: list[str] | None = None) -> int:
    a = _parse(sys.argv[1:] if argv is None else argv)
    os.umask(int(a.umask, 8) & 0o777)
    run_dir = Path(a.run_dir)
    adir = protocol.attempt_dir(run_dir, a.attempt)
    slot = _batch_slot(a)
    if slot is not None:  # the launch left this attempt's records in its batch, and its ballast's room
        # Given back first: on a disk that filled while the task was queued, what follows is made in that room.
        give_back(run_dir, slot.token, slot.task)
        try:  # no launch made attempts/<n> under its checks: a symlink planted in the empty run dir is refused
            protocol.resolve_inside(run_dir, f"{protocol.ATTEMPTS_DIR}/{a.attempt}")
        except protocol.UnsafePath as e:
            print(f"orch wrapper: refusing to write through {run_dir}: {e}; the program was not run",
                  file=sys.stderr, flush=True)
            return 2
    adir.mkdir(parents=True, exist_ok=True)
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    if slot is not None and a.fence is not None:
        try:
            protocol.claim_fence(adir, a.token, a.fence, slot)  # kept if a cancel or a re-claimer wrote one first
        except OSError as e:  # then no fence names this launch: the check below runs nothing
            print(f"orch wrapper: cannot put {protocol.FENCE_FILE} in place: {e}", file=sys.stderr, flush=True)
    # Before anything of the current launch is touched (its exit.json set aside, its ballast): a
    # launcher that lost its claim still called the backend, and two copies ran (the fence's failure).
    stale = _stale_fence(a, adir)
    if stale:
        _superseded(a, adir, restart, stale)
        return 0
    if slot is not None:
        _command_record(run_dir, adir, slot)
    protocol.set_aside(adir / protocol.EXIT_FILE)
    # Each run of an in-place requeue keeps its own start record (wrapper.prev-<k>.json): the rerun overwrote the
    # first run's, and goodput and `orch plot` lost where it began (issue 45).
    protocol.set_aside(adir / protocol.WRAPPER_FILE)
    # A Slurm in-place rerun of this attempt (same token): the earlier run's completion or stop is not this one's.
    protocol.set_aside(adir / protocol.COMPLETE_FILE)
    protocol.set_aside(adir / protocol.STOP_FILE)
    ballast = Ballast(adir / protocol.EXIT_RESERVE)
    try:
        return _attempt(a, run_dir, adir, restart, ballast)
    finally:
        ballast.release()  # never left behind, whatever ended the wrapper


def _batch_slot(a: argparse.Namespace) -> protocol.GroupSlot | None:
    """--batch/--task as a slot, only when well formed (the token becomes a path component)."""
    if a.batch is None or a.task is None:
        return None
    if not protocol.is_group_token(a.batch) or a.task < 0:
        print(f"orch wrapper: ignoring --batch {a.batch!r} --task {a.task}: not a batch token and index",
              file=sys.stderr, flush=True)
        return None
    return protocol.GroupSlot(a.batch, a.task)


def _command_record(run_dir: Path, adir: Path, slot: protocol.GroupSlot) -> None:
    """The attempt's command.json from its batch's records, unless one is in place (a Slurm rerun in place)."""
    if (adir / protocol.COMMAND_FILE).exists():
        return
    try:
        records = protocol.read_json_bounded(protocol.batch_file(run_dir.parent, slot.token, protocol.BATCH_RECORDS),
                                             limit=64 << 20)
        rec = records.get(str(slot.task)) if isinstance(records, dict) else None
        if isinstance(rec, dict):
            protocol.atomic_create(adir / protocol.COMMAND_FILE, json.dumps(rec, sort_keys=True) + "\n")
            return
        why = "no record for this task"
    except (OSError, ValueError, protocol.UnsafePath) as e:
        why = str(e)
    # Informative only (orch show: what the attempt ran and what its launch set aside): never worth not running.
    print(f"orch wrapper: no {protocol.COMMAND_FILE} from batch {slot.token}: {why}", file=sys.stderr, flush=True)


def _stale_fence(a: argparse.Namespace, adir: Path) -> str:
    """Why this wrapper's launch is not the attempt's current one ('' when it is, or unfenced)."""
    if a.fence is None:
        return ""  # launched by an orch from before fencing
    current = protocol.read_fence(adir)
    if current is None:
        return f"no readable {protocol.FENCE_FILE} in {adir}"
    token, fence = current
    if token != a.token or fence != a.fence:
        return f"launch generation {a.fence} is not the attempt's current one ({fence}, token {token})"
    return ""


def _superseded(a: argparse.Namespace, adir: Path, restart: int, why: str) -> None:
    """Note, outside exit.json, that this wrapper ran nothing, and why."""
    print(f"orch wrapper: superseded: {why}; the program was not run", file=sys.stderr, flush=True)
    try:
        protocol.atomic_write_json(adir / protocol.SUPERSEDED_FILE, {
            "token": a.token, "fence": a.fence, "why": why, "pid": os.getpid(), "host": os.uname().nodename,
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "restart_count": restart, "at": protocol.now_iso()})
    except OSError as e:
        print(f"orch wrapper: cannot write {protocol.SUPERSEDED_FILE}: {e}", file=sys.stderr, flush=True)


def _expected_resume_step(run_dir: Path, attempt: int, overrides: str | None) -> int | None:
    """``ORCH_RESUME_STEP`` for the program (protocol.expected_resume_step); None when the run dir cannot tell."""
    try:
        parsed = json.loads(overrides or "{}")
        return protocol.expected_resume_step(run_dir, attempt, parsed if isinstance(parsed, dict) else {})
    except (OSError, ValueError):
        return None


def _attempt(a: argparse.Namespace, run_dir: Path, adir: Path, restart: int, ballast: Ballast) -> int:
    env = dict(os.environ)
    env.update(protocol.job_env(run_dir, a.job, a.attempt, token=a.token))
    if protocol.ENV_OVERRIDES in os.environ:  # the backend passed the policy's overrides
        env[protocol.ENV_OVERRIDES] = os.environ[protocol.ENV_OVERRIDES]
    env.update(protocol.tracker_env(os.environ, run_dir, a.job))
    env.pop(protocol.ENV_RESUME_STEP, None)  # never one inherited from elsewhere
    resume = _expected_resume_step(run_dir, a.attempt, env.get(protocol.ENV_OVERRIDES))
    if resume is not None:
        env[protocol.ENV_RESUME_STEP] = str(resume)
    env[protocol.ENV_MARKER_WRITER] = protocol.MARKER_WRITER_WRAPPER  # the kit records completion; we mark

    def record(rc: int | None, **kw: object) -> None:
        def write() -> None:
            protocol.write_exit(adir, protocol.ExitRecord(
                token=a.token, returncode=rc, ended_at=protocol.now_iso(), restart_count=restart,
                disk_full=ballast.disk_full, **kw))  # type: ignore[arg-type]
        ballast.write(write)

    # The one completion predicate, once more at the door: Slurm can rerun a task it requeued while the task
    # was finishing (a prio job's preemption caught it as it exited), after its marker verified. Running the
    # program again in a finished run dir could only rewrite a verified result.
    if protocol.verify_done_marker(run_dir).verified:
        record(0, error="already complete: the run dir's done marker verifies; the program was not run again")
        return 0

    marker_before = _marker_identity(run_dir)
    where = os.environ.get("SLURM_JOB_NODELIST") or os.uname().nodename
    launch = os.urandom(6).hex()
    try:
        argv, world_size, step_job = _program(a, launch)
    except ranklaunch.RankLaunchError as e:
        record(127, error=f"cannot launch the ranks: {e}", nodes=where)
        return 127
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
    with open(os.open(adir / protocol.STDOUT_LOG, flags, 0o666), "ab") as out, \
            open(os.open(adir / protocol.STDERR_LOG, flags, 0o666), "ab") as err:
        run_id, said = _arrange_trackers(run_dir, a.job, a.attempt, env, err)  # One MLflow run per job
        if said:
            err.write(f"orch wrapper: {said}\n".encode())
        if run_id is not None:
            env[mlflowrun.RUN_ID_ENV] = run_id
        cgroup = memlimit.for_attempt(a.token, a.mem_mb, err)  # Tells a kernel OOM kill apart
        try:
            child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                     env=env, cwd=str(run_dir), preexec_fn=cgroup.join_self if cgroup else None)
        except OSError as e:  # command not found / not executable: the job's own fault, recorded
            err.write(f"orch wrapper: cannot start {argv[0]!r}: {e}\n".encode())
            memlimit.close(cgroup)
            record(127, error=str(e), world_size=world_size, nodes=where)
            return 127
        sup = Supervisor(child, a.warning_signal, under_slurm="SLURM_JOB_ID" in os.environ, step_job=step_job,
                         token=a.token)
        for s in FORWARDED:
            signal.signal(s, sup.on_signal)
        watcher = _start_watcher(a, sup)
        stopped_watch = StoppedWatch(child.pid, adir)  # a program stopped hang_timeout_s is hung (staleness)
        try:  # informative only: a full disk here must not kill the wrapper before exit.json
            protocol.atomic_write_json(adir / protocol.WRAPPER_FILE, {
                "token": a.token, "pid": os.getpid(), "child_pid": child.pid, "host": os.uname().nodename,
                "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "restart_count": restart,
                "command": a.command, "started_at": protocol.now_iso(), "world_size": world_size, "nodes": where,
                **({"ranks_command": argv, "launch": launch} if world_size else {})})
        except OSError as e:
            ballast.disk_full |= e.errno == errno.ENOSPC
        deadline = None if not a.time_limit else time.monotonic() + a.time_limit
        while True:
            left = None if deadline is None else max(1e-3, deadline - time.monotonic())
            rc, timed_out = sup.wait(left, a.kill_grace)
            program_ended_at = protocol.now_iso()  # before its leftovers are stopped (their stop records come after)
            if step_job is not None:
                sup.await_preemption(step_job)
            relaunched = None if not world_size or timed_out else rankrestart.relaunch(rankrestart.Launch(
                a.token, a.attempt, a.rank_restarts, run_dir, adir, _torchrun_dir(a), world_size, launch,
                lambda new, k, avoid: _program(a, new, relaunch=k, avoid=avoid)[:2],
                os.environ.get("SLURM_JOB_NODELIST") if a.spare_nodes or a.min_nodes else None), rc, env, sup, cgroup,
                out, err, deadline)
            if relaunched is None:
                break
            launch, argv, child, world_size = relaunched  # fewer nodes left (--min-nodes): a smaller world
            stopped_watch.stop()
            stopped_watch = StoppedWatch(child.pid, adir)
        # From the program's exit until exit.json is written, a stop stays pending instead of running
        # the handler: the marker decision below sees every stop that arrived before it commits.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        stopped_watch.stop()
        if watcher is not None:
            watcher.stop()
    try:
        sup.reap_signallers()
        stop_leftovers(token=a.token)
        oom_kill = memlimit.close(cgroup)
        sig = -rc if rc < 0 else None
        marker_error, aside = _end_of_run(a, run_dir, adir, rc, sup, ballast, marker_before)
        testhooks.site("wrapper_end_decided")  # a stop from here on came after the decision: held, not recorded
        record(rc, signal=sig, time_limit_reached=timed_out, stop_signal=sup.stop_signal,
               stop_source=sup.stop_source, notice=sup.notice, marker_error=marker_error, marker_set_aside=aside,
               oom_kill=oom_kill, world_size=world_size, nodes=where, program_ended_at=program_ended_at,
               **_failed_rank(a, launch, rc, world_size))
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    return 128 + sig if sig else rc


def _marker_identity(run_dir: Path) -> tuple[int, int, int] | None:
    """(inode, mtime_ns, size) of done.json, or None: tells a marker the program wrote during the attempt."""
    try:
        st = os.lstat(run_dir / protocol.DONE_MARKER)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _note_pending_stops(sup: Supervisor) -> None:
    """Stops that arrived while blocked count as delivered (their handler runs only after exit.json)."""
    pending = signal.sigpending() & STOPS
    for s in sorted(pending):
        if s == signal.SIGUSR2:
            sup._note(sup.warning, protocol.StopSource.WARNING)
        else:
            sup._note(s, protocol.StopSource.SIGNAL)


def _refusal(rc: int, sup: Supervisor, stop: protocol.StopRecord | None, disk_full: bool) -> str | None:
    """Why this attempt must not be marked done (None: it may be): exit, stops from anywhere, a full disk."""
    if rc != 0:
        return f"the program exited {rc}" if rc > 0 else f"the program was killed by signal {-rc}"
    if sup.stop_signal is not None:
        return f"the program was sent SIG{sup.stop_signal} ({sup.stop_source})"
    if stop is not None:  # a SIGTERM that never passed through us: a user's kill, a container stop
        return f"the program recorded a stop (SIG{stop.signal}) in {protocol.STOP_FILE}"
    if disk_full:  # a truncated output of exit 0 was verified (hostile test)
        return "the disk was full during the run (outputs may be truncated)"
    return None


def _end_of_run(a: argparse.Namespace, run_dir: Path, adir: Path, rc: int, sup: Supervisor, ballast: Ballast,
                marker_before: tuple[int, int, int] | None) -> tuple[str | None, str | None]:
    """The marker decision, after the program exited: (marker_error, where a refused done.json was set aside)."""
    _note_pending_stops(sup)
    stop = protocol.read_stop(adir, a.token)
    completion = protocol.read_completion(adir, a.token)
    programs_marker = _marker_identity(run_dir) not in (None, marker_before)  # it wrote done.json itself
    why = _refusal(rc, sup, stop, ballast.disk_full)
    stopped_or_failed = rc != 0 or sup.stop_signal is not None or stop is not None
    marker_error, wrote = None, False
    if completion is not None or a.outputs:
        if why is None:
            patterns = [f"{protocol.RESULT_DIR}/**", *(completion.patterns() if completion else []), *a.outputs]
            marker_error = write_outputs_marker(run_dir, a.job, a.attempt, patterns, ballast)
            wrote = marker_error is None
        else:
            marker_error = f"not written: {why}"
    testhooks.site("wrapper_marker_decided")
    _note_pending_stops(sup)
    if why is None and sup.stop_signal is not None:
        # A TERM that came while the marker was written (a VM shutdown signals every process): never a
        # marker after a stop, so the one just written goes aside.
        why = f"the wrapper was sent SIG{sup.stop_signal} ({sup.stop_source}) as the program ended"
        stopped_or_failed = True
    # A done.json of the program's own stands only on exit 0 unstopped (a full disk alone leaves it to
    # verify_done_marker, which checks every byte it lists).
    if not (stopped_or_failed and (wrote or programs_marker)):
        return marker_error, None
    try:
        aside = protocol.set_aside_marker(run_dir)
    except OSError as e:
        return f"not verified: {why}; could not set {protocol.DONE_MARKER} aside: {e}", None
    return f"set aside: {why}", (f"{aside.name} ({why})" if aside else None)


def read_exit(attempt_dir: Path) -> protocol.ExitRecord | None:
    """The wrapper's exit record (any token), or None if absent or malformed."""
    return protocol.read_exit(attempt_dir)


if __name__ == "__main__":
    sys.exit(main())
