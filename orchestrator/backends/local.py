"""Local backend: runs an attempt as a detached session on this machine.

Why not submitit's LocalExecutor: its jobs are killed after ``timeout_min`` (2 min by default), and
a ``LocalJob`` re-attached from another process reports done() while the job still runs (see
``shared/notes/submitit.md``) — a cron reconciler is exactly such another process.

This launcher double-forks orch's job wrapper into a new session (it survives the submitter). The
external id is ``"<session id>@<start ticks>@<pid ns>.<time ns>"``: the wrapper's pid, which is
also its session id, its start time in clock ticks since boot (``proctable``: a clock step cannot
move it), and the PID and time namespaces those were read in (ids from before have no namespace
part). A reconciler in other namespaces sees other pids and shifted ticks: it answers UNKNOWN. The job
is alive while ANY process of that session lives — the wrapper, or what it started after the
wrapper itself was killed — and only when none is left does ``poll`` read the wrapper's exit record.
When liveness cannot be decided (another namespace; start ticks that do not match while processes
of the session live; members of the session that cannot be proven the job's) the answer is UNKNOWN,
and nothing is requeued while it may run: only "no process of the session exists" is gone.

Signals go only to processes orch can prove are the job's: the session leader whose start ticks
match, or session members whose environment carries the attempt's token. Never a pid read from a
file the job can write (a forged wrapper.json made ``orch cancel`` kill another process).
"""

from __future__ import annotations

import os
import re
import signal
import stat
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator import protocol
from orchestrator.backends.base import AttemptRef, Backend, BackendError, Capabilities, Outcome, Phase, SubmitSpec
from orchestrator.jobside import memlimit, proctable
from orchestrator.jobside.ballast import BALLAST_BYTES
from orchestrator.protocol import FailureClass


@dataclass(frozen=True)
class LocalId:
    """What a local external id records: the session, the leader's start ticks, and the namespaces
    (PID, time) those two numbers were read in (None for ids written before orch recorded them)."""

    sid: int
    ticks: int | None
    ns: tuple[int, int] | None = None


_ID = re.compile(r"(\d+)@(\d+|\?)(?:@(\d+)\.(\d+))?")


def format_id(sid: int, start_ticks: int | None, ns: tuple[int, int] | None = None) -> str:
    """``sid@ticks`` (the format of every id before namespaces were recorded), plus ``@pidns.timens``
    when the namespaces the ticks were read in are known."""
    base = f"{sid}@{start_ticks if start_ticks is not None else '?'}"
    return f"{base}@{ns[0]}.{ns[1]}" if ns is not None else base


def parse_id(external_id: str | None) -> LocalId | None:
    """``sid@ticks`` or ``sid@ticks@pidns.timens``; also 0.1's ``pid:create_ms`` (ticks unknown:
    identity then rests on the token alone). None for anything else."""
    s = external_id or ""
    m = _ID.fullmatch(s)
    if m:
        sid, ticks = int(m[1]), (int(m[2]) if m[2] != "?" else None)
        ns = (int(m[3]), int(m[4])) if m[3] is not None else None
    else:
        sid_s, sep, rest = s.partition(":")
        if not (sep and sid_s.isdigit() and rest.isdigit()):
            return None
        sid, ticks, ns = int(sid_s), None, None
    if sid <= 1:  # 0 is the kernel's session, 1 init's: never a job
        return None
    return LocalId(sid, ticks, ns)


@dataclass(frozen=True)
class Liveness:
    state: str  # "alive" | "gone" | "unknown"
    leader: proctable.Proc | None  # the wrapper, when it still runs
    members: tuple[proctable.Proc, ...]  # processes proven to be the job's
    why: str = ""


def _foreign_view(ident: LocalId, here: tuple[int, int] | None) -> str:
    """Why this process's view of /proc cannot judge the id ('' when it can)."""
    if here is None:
        return ("liveness undecidable: /proc here is not this reconciler's own PID namespace's "
                "(its process table cannot be read)")
    if ident.ns is None:
        return ""  # an id from before namespaces were recorded: judged as before
    if ident.ns[0] != here[0]:
        return ("liveness undecidable: this reconciler runs in another PID namespace than the one "
                "that launched the job")
    if ident.ns[1] != here[1]:
        return ("liveness undecidable: this reconciler runs in another time namespace than the one "
                "that launched the job (start times are shifted)")
    return ""


class TokenCarriers:
    """Live processes by the attempt token their kernel-held environment carries: ONE scan of the process
    table, made only when a liveness question needs it (a session found empty), shared by a whole poll."""

    def __init__(self) -> None:
        self._by_token: dict[str, list[proctable.Proc]] | None = None

    def __call__(self, token: str) -> list[proctable.Proc]:
        if self._by_token is None:
            self._by_token = {}
            for p in proctable.all_procs():
                tok = None if p.zombie else proctable.environ_value(p.pid, protocol.ENV_TOKEN)
                if tok:
                    self._by_token.setdefault(tok, []).append(p)
        return self._by_token.get(token, [])


def liveness(ref_id: str | None, token: str, table: dict[int, list[proctable.Proc]],
             here: tuple[int, int] | None, carriers: TokenCarriers | None = None) -> Liveness:
    """Is the attempt's session alive? Decided from the kernel's process table, never from files.

    ``here`` is ``proctable.namespaces()`` of the caller. "gone" only when no process of the
    session exists, seen from the namespaces the job was launched in: a reused pid, a shifted clock
    and another namespace cannot be told apart from the real job, so they answer "unknown". With
    ``carriers``, also only when no process outside the session carries the attempt's token: torchrun
    starts each rank in a session of its own, and with the wrapper and torchrun killed the ranks trained on
    while the attempt was called gone and `orch cancel` stopped nothing (a hostile test).
    """
    ident = parse_id(ref_id)
    if ident is None:
        return Liveness("gone", None, (), "no process identity recorded")
    why = _foreign_view(ident, here)
    if why:
        return Liveness("unknown", None, (), why)
    sid, ticks = ident.sid, ident.ticks
    members = table.get(sid, [])
    holder = proctable.read_proc(sid)  # zombies included: a zombie still holds the number
    if holder is not None and ticks is not None and holder.start_ticks != ticks:
        if members:
            return Liveness("unknown", None, (), (
                f"liveness undecidable: process {sid} started at tick {holder.start_ticks}, not {ticks} as "
                f"recorded, yet {len(members)} process(es) of session {sid} live (a reused pid or a "
                "shifted clock cannot be told apart from the job)"))
        # The number was handed to a new process, which the kernel does only after every process of
        # our session (which held it as their session id) was gone.
        return _left_the_session(token, carriers, sid) or Liveness(
            "gone", None, (), "its session ended (the id now names another process)")
    if holder is None or holder.zombie:
        leader = None
    elif ticks is not None:
        leader = holder  # pid + start ticks name this very process (also before its setsid ran)
    elif holder.session == sid and proctable.environ_has(holder.pid, protocol.ENV_TOKEN, token):
        leader = holder  # a 0.1 id without start ticks: the leader must prove itself by its token
    else:
        leader = None
    if leader is not None:
        return Liveness("alive", leader, tuple({p.pid: p for p in (leader, *members)}.values()))
    mine = [p for p in members if proctable.environ_has(p.pid, protocol.ENV_TOKEN, token)]
    if mine:
        return Liveness("alive", None, tuple(mine), "the wrapper is gone but the program runs")
    if members:
        return Liveness("unknown", None, (), (
            f"liveness undecidable: {len(members)} process(es) of session {sid} live but none can be proven "
            "the job's (no readable token)"))
    return _left_the_session(token, carriers, sid) or Liveness("gone", None, ())


def _left_the_session(token: str, carriers: TokenCarriers | None, sid: int | None = None) -> Liveness | None:
    """Alive by the processes that left the attempt's session but carry its token, else None."""
    left = own_carriers(token, carriers, sid) if carriers is not None else []
    if not left:
        return None
    return Liveness("alive", None, tuple(left),
                    f"its session is gone but {len(left)} process(es) carrying the attempt's token run "
                    "(a rank of torchrun's, in a session of its own)")


def own_carriers(token: str, carriers: TokenCarriers, sid: int | None) -> list[proctable.Proc]:
    """The processes carrying ``token`` that belong to the launch whose session is ``sid``: not those under a live
    job wrapper of another session. A re-claimed launch of the same attempt carries the same token; the stale
    launch's cancel, its own session ended, signalled the healthy relaunch's program (a hostile test)."""
    return [p for p in carriers(token) if not _under_another_wrapper(p, sid)]


def _under_another_wrapper(p: proctable.Proc, sid: int | None) -> bool:
    """``p`` or one of its ancestors is a live job wrapper other than the leader of session ``sid``."""
    seen: set[int] = set()
    pid = p.pid
    while pid > 1 and pid not in seen:
        seen.add(pid)
        if pid != sid and proctable.wrapper_run_dir(pid) is not None:
            return True
        q = proctable.read_proc(pid)
        if q is None:
            return False
        pid = q.ppid
    return False


def _tops(procs: Sequence[proctable.Proc]) -> list[proctable.Proc]:
    """The roots of the job's process trees (what the wrapper's signal would reach first)."""
    pids = {p.pid for p in procs}
    return [p for p in procs if p.ppid not in pids]


def _signal_all(procs: Sequence[proctable.Proc], sig: int) -> None:
    for p in procs:
        try:
            os.kill(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class LocalBackend(Backend):
    name = "local"
    # orch keeps a sweep's queue (no scheduler), and liveness is this host's process table.
    capabilities = Capabilities(group_queue=False, host_liveness=True, extras=frozenset())

    def submit(self, spec: SubmitSpec) -> str:
        spec.attempt_dir.mkdir(parents=True, exist_ok=True)
        argv = spec.wrapper_argv(time_limit_s=spec.resources.time_s, mem_mb=spec.resources.mem_mb)
        env = spec.job_environ()
        env.update(spec.env)
        env[protocol.ENV_TOKEN] = spec.token  # the wrapper's own environment names its attempt too
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError as e:
            os.close(r)
            os.close(w)
            raise BackendError(f"cannot fork: {e}") from None
        if pid == 0:  # first child: fork the wrapper, report its pid + start ticks, exit
            try:
                os.close(r)
                gpid = os.fork()
                if gpid == 0:
                    os.setsid()  # own session: the job is every process of it
                    os.close(w)
                    fd = os.open(os.devnull, os.O_RDWR)
                    log = os.open(spec.attempt_dir / protocol.WRAPPER_LOG,
                                  os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
                    os.dup2(fd, 0)
                    os.dup2(log, 1)
                    os.dup2(log, 2)
                    os.chdir(spec.run_dir)
                    os.execve(sys.executable, argv, env)
                # Read the start ticks while the wrapper is our child: even if it already exited it
                # is a zombie that only we can reap, so its /proc entry is still there.
                # ...and the namespaces they were read in: another namespace reads other numbers.
                p = proctable.read_proc(gpid)
                ns = proctable.namespaces()
                where = f"{ns[0]}.{ns[1]}" if ns else "-"
                os.write(w, f"{gpid} {p.start_ticks if p else -1} {where}".encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            data = f.read().split()
        os.waitpid(pid, 0)
        try:
            gpid, ticks = int(data[0]), int(data[1])
            pidns, _, timens = data[2].partition(".")
            ns = (int(pidns), int(timens)) if data[2] != "-" else None
        except (ValueError, IndexError):
            raise BackendError(f"local launch of {spec.job} attempt {spec.attempt} failed") from None
        return format_id(gpid, ticks if ticks >= 0 else None, ns)

    def poll(self, refs: Sequence[AttemptRef]) -> dict[str, Outcome]:
        table, here, carriers = proctable.sessions(), proctable.namespaces(), TokenCarriers()
        out: dict[str, Outcome] = {}
        for ref in refs:
            live = liveness(ref.external_id, ref.token, table, here, carriers)
            if live.state == "alive":
                out[ref.token] = Outcome(Phase.RUNNING, reason=live.why)
            elif live.state == "unknown":
                out[ref.token] = Outcome(Phase.UNKNOWN, reason=live.why)
            else:
                out[ref.token] = self._ended(ref)
        return out

    @staticmethod
    def _ended(ref: AttemptRef) -> Outcome:
        # Read only once no process of the job is left: a running job can write its own exit.json
        #, but a record read after the job is gone is the last word the job had.
        rec = protocol.read_exit(ref.attempt_dir, ref.token)
        if rec is None:
            # Gone without an exit record: the wrapper was killed (SIGKILL, OOM killer, reboot), or the
            # disk was too full for even its ballast (hostile test: such a job waited for a human as unknown).
            memlimit.remove_leftover(ref.token)  # its --mem cgroup, which the wrapper never removed
            free = _free_bytes(ref.attempt_dir)
            if free is not None and free < BALLAST_BYTES:
                return Outcome(Phase.VANISHED, cause=FailureClass.ENOSPC,
                               reason=f"process gone without an exit record; the run dir's filesystem has "
                                      f"{free >> 10} KiB free")
            return Outcome(Phase.VANISHED, reason="process gone without an exit record")
        return Outcome(Phase.EXITED, exit_code=rec.returncode, signal=rec.signal,
                       cause=FailureClass.TIMEOUT if rec.time_limit_reached else None,
                       reason=rec.marker_error or "")

    def cancel(self, refs: Sequence[AttemptRef]) -> None:
        """SIGTERM: to the wrapper, which passes the stop to the program (and records that it did);
        if the wrapper is gone, to the roots of the job's remaining process trees."""
        table, here, carriers = proctable.sessions(), proctable.namespaces(), TokenCarriers()
        for ref in refs:
            live = liveness(ref.external_id, ref.token, table, here, carriers)
            if live.state != "alive":
                continue
            _signal_all([live.leader] if live.leader else _tops(live.members), signal.SIGTERM)

    def kill(self, refs: Sequence[AttemptRef]) -> None:
        """SIGKILL every process of each attempt's session (a job that ignored SIGTERM), and every process
        that left it but carries the attempt's token (torchrun's workers run in sessions of their own: with
        torchrun and the wrapper killed, the ranks lived on as orphans)."""
        table, here, carriers = proctable.sessions(), proctable.namespaces(), TokenCarriers()
        for ref in refs:
            live = liveness(ref.external_id, ref.token, table, here, carriers)
            if live.state == "alive":
                _signal_all(live.members or ([live.leader] if live.leader else []), signal.SIGKILL)
                known = {p.pid for p in live.members}
                ident = parse_id(ref.external_id)
                _signal_all([p for p in own_carriers(ref.token, carriers, ident.sid if ident else None)
                             if p.pid not in known], signal.SIGKILL)

    def find_by_token(self, refs: Sequence[AttemptRef]) -> dict[str, str]:
        """A lost launch is found by its token in a live process's environment (kernel data), or by
        an exit record carrying it (only a process that was launched can know the token)."""
        wanted = {r.token for r in refs}
        found: dict[str, str] = {}
        here = proctable.namespaces()  # the ticks below are read in this process's namespaces
        for p in proctable.all_procs():
            if p.zombie:
                continue
            tok = proctable.environ_value(p.pid, protocol.ENV_TOKEN)
            if tok in wanted and tok not in found:
                leader = proctable.read_proc(p.session)
                ticks = leader.start_ticks if leader is not None and leader.session == p.session else None
                found[tok] = format_id(p.session, ticks, here)
        for ref in refs:
            if ref.token not in found and protocol.read_exit(ref.attempt_dir, ref.token) is not None:
                found[ref.token] = "ended"  # it ran and exited: poll reads its exit record
        return found

    def live_in_run_dir(self, run_dir: Path) -> list[str]:
        """Live processes (by kernel-held environment) running in ``run_dir`` as some orch attempt."""
        return live_by_run_dir([run_dir]).get(os.path.realpath(run_dir), [])

    def live_in_run_dirs(self, run_dirs: Sequence[Path]) -> dict[Path, list[str]]:
        # One process-table scan for a whole sweep: one per task was 18% of submitting 1,000 (bench P6).
        real = real_paths(run_dirs)
        found = live_by_run_dir(run_dirs, real) if run_dirs else {}
        return {d: found.get(real[d], []) for d in run_dirs}




def _free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def real_paths(paths: Sequence[Path]) -> dict[Path, str]:
    """``os.path.realpath`` of each path, its parent resolved once for all its siblings: a path that is no symlink
    resolves to its parent's real path plus its name (one lstat), where ``realpath`` walks every component of every
    path (10,000 lstats, twice, in a 1,000-task sweep's check)."""
    parents: dict[Path, str] = {}
    out: dict[Path, str] = {}
    for p in paths:
        try:
            plain = p.name not in ("", ".", "..") and not stat.S_ISLNK(os.lstat(p).st_mode)
        except FileNotFoundError:
            plain = True  # a plain name (only those get the lstat) of nothing: no symlink either
        except OSError:
            plain = False
        if not plain:
            out[p] = os.path.realpath(p)
            continue
        if p.parent not in parents:
            parents[p.parent] = os.path.realpath(p.parent)
        out[p] = os.path.join(parents[p.parent], p.name)
    return out


def live_by_run_dir(run_dirs: Iterable[Path | str] = (), real: Mapping[Path, str] | None = None,
                    ) -> dict[str, list[str]]:
    """run dir -> the live processes whose kernel-held environment names it (``ORCH_RUN_DIR``), as
    "pid N (attempt K)": ONE scan of the process table for any number of run dirs (a requeue pass
    asks about every job it would launch). A process that left its attempt's session (``setsid``)
    keeps that environment, so it is found here although the attempt itself has ended.

    Keys are real paths (look up ``os.path.realpath(run_dir)``): the same run dir spelled through a
    symlinked parent or ``x/..`` was taken for another one, and a second attempt started beside the
    first (hostile test). A job wrapper counts by its ``--run-dir`` (its program may have cleared
    its environment).

    For the ``run_dirs`` given, also every process whose cwd or an open file lies under one of them
    (``/proc/PID/cwd``, ``/proc/PID/fd/*``): one that cleared its environment AND left the session
    (``env -i setsid ... &``) carries nothing else, and ``orch requeue`` started attempt 2 beside it
    (hostile test). This process and its ancestors (the user's shell that runs orch, maybe in the run
    dir) are not counted."""
    roots = set(real.values()) if real is not None else {os.path.realpath(d) for d in run_dirs}
    mine = _self_and_ancestors() if roots else set()
    out: dict[str, list[str]] = {}
    for p in proctable.all_procs():
        if p.zombie:
            continue
        run_dir = proctable.environ_value(p.pid, protocol.ENV_RUN_DIR) or proctable.wrapper_run_dir(p.pid)
        if run_dir is not None:
            # A wrapper's own environment has no ORCH_ATTEMPT (its program's has): its argv says (it printed "?")
            attempt = (proctable.environ_value(p.pid, protocol.ENV_ATTEMPT)
                       or proctable.wrapper_option(p.pid, "--attempt") or "?")
            out.setdefault(os.path.realpath(run_dir), []).append(f"pid {p.pid} (attempt {attempt})")
        elif roots and p.pid not in mine:
            hit = _root_of(roots, proctable.paths_in_use(p.pid))
            if hit is not None:
                out.setdefault(hit, []).append(f"pid {p.pid} (its cwd or an open file is in the run dir)")
    return out


def _root_of(roots: set[str], paths: Iterable[str]) -> str | None:
    """The first (sorted) of ``roots`` (real paths) that the first of ``paths`` lying in one lies in, else None.

    Each path's own ancestors are looked up (a set), not every root compared with it: a 1,000-task sweep's
    scan compared each open file of each process with 1,000 roots (a tenth of the sweep)."""
    for path in paths:
        hits, p = [], path.rstrip("/") or "/"
        while True:
            if p in roots:
                hits.append(p)
            parent = os.path.dirname(p)
            if parent == p:
                break
            p = parent
        if hits:
            return min(hits)
    return None


def _self_and_ancestors() -> set[int]:
    """This process and its parents up to init: the shell that runs orch may well sit in a run dir."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        p = proctable.read_proc(pid)
        if p is None:
            break
        pid = p.ppid
    return out
