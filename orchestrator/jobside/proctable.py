"""This machine's process table, read from /proc: who belongs to which session, since when.

Why not psutil's ``create_time``: it is ``btime + start ticks / HZ``, and ``btime`` (from
/proc/stat) moves when the clock is stepped (a VM restore shifted it by 1 s and a pid + create_time
check with 20 ms slack declared a live job dead, so a second attempt started beside the first).
The start time in *clock ticks since boot* (field 22 of /proc/<pid>/stat) is fixed for the life
of a process and no clock step moves it; (pid, start ticks) names one process for the life of the
machine.

A local job runs in its own session (the wrapper calls ``setsid``), so "the job" is every process
whose session id is the wrapper's pid — also after the wrapper itself was killed (kill -9
of the wrapper alone left the trainer running while orch requeued the job). A session id stays
reserved while any process of the session lives (the kernel cannot hand the number to a new
process meanwhile), so session members found while the leader lives, or carrying the attempt's
token in their environment, are the job's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

PROC = "/proc"
# The module a job wrapper runs as: its name since orchestrator/jobside/ holds the compute node's code, and its name
# before, which the argv of a job started by an older orch still shows (it is recovered after an upgrade).
WRAPPER_MODULES = frozenset({b"orchestrator.jobside.wrapper", b"orchestrator.wrapper"})
RANK_PARENT_MODULES = frozenset({b"orchestrator.jobside.rankend", b"orchestrator.rankend"})


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    session: int
    start_ticks: int
    state: str  # R, S, D, Z, T, ...

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def read_proc(pid: int) -> Proc | None:
    """One process's stat line, or None if it is gone (or unreadable)."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: the fields after it start after the LAST ')'.
    try:
        rest = data[data.rindex(b")") + 2:].split()
        return Proc(pid=pid, ppid=int(rest[1]), session=int(rest[3]), start_ticks=int(rest[19]),
                    state=rest[0].decode())
    except (ValueError, IndexError):
        return None


def all_procs() -> Iterator[Proc]:
    try:
        names = os.listdir(PROC)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            p = read_proc(int(name))
            if p is not None:
                yield p


def sessions() -> dict[int, list[Proc]]:
    """session id -> its live (non-zombie) processes: one scan of /proc for a whole poll."""
    out: dict[int, list[Proc]] = {}
    for p in all_procs():
        if not p.zombie:
            out.setdefault(p.session, []).append(p)
    return out


def namespaces() -> tuple[int, int] | None:
    """(PID namespace, time namespace) of this process as inode numbers; None when undecidable.

    Why: pids and start ticks mean something only in the namespaces they were read in. Another PID
    namespace (``unshare --pid --mount-proc``, a container) shows a different process table, where
    the job looks gone; a time namespace with a boot-time offset shifts every start tick in
    /proc/<pid>/stat. None when /proc is not this process's own PID namespace's (``/proc/self`` is
    not our pid): then nothing read from it can be trusted. 0 for a kernel without time namespaces.
    """
    try:
        if os.readlink(f"{PROC}/self") != str(os.getpid()):
            return None
        pidns = os.stat(f"{PROC}/self/ns/pid").st_ino
    except OSError:
        return None
    try:
        timens = os.stat(f"{PROC}/self/ns/time").st_ino
    except FileNotFoundError:
        timens = 0  # kernel before 5.6: no time namespaces, so no offset either
    except OSError:
        return None
    return pidns, timens


def environ_has(pid: int, key: str, value: str) -> bool | None:
    """Whether process ``pid`` started with ``key=value`` in its environment; None if unreadable.

    The kernel's copy of what the process was exec'ed with: not a file the job can rewrite.
    """
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return None
    return f"{key}={value}".encode() in data.split(b"\0")


def wrapper_run_dir(pid: int) -> str | None:
    """The ``--run-dir`` of an orch job wrapper process (``-m orchestrator.jobside.wrapper``), else None.

    A program that cleared its environment (``env -i``) carries no ORCH_RUN_DIR, but its wrapper
    lives as long as it does and names the run dir in its argv."""
    return wrapper_option(pid, "--run-dir")


def wrapper_option(pid: int, flag: str) -> str | None:
    """The value of ``flag`` (``--run-dir``, ``--attempt``) in an orch job wrapper's argv, else None."""
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            argv = f.read(1 << 16).split(b"\0")
    except OSError:
        return None
    if not WRAPPER_MODULES & set(argv):
        return None
    try:
        return argv[argv.index(flag.encode()) + 1].decode(errors="replace")
    except (ValueError, IndexError):
        return None


def environ_value(pid: int, key: str) -> str | None:
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return None
    prefix = key.encode() + b"="
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")
    return None


def paths_in_use(pid: int) -> Iterator[str]:
    """The cwd and the paths of the open files of ``pid`` (the kernel's real paths; sockets, pipes and
    unreadable entries skipped). What ties a process that cleared its environment to a run dir."""
    try:
        yield os.readlink(f"{PROC}/{pid}/cwd")
    except OSError:
        return  # gone, or another user's: nothing more is readable either
    try:
        fds = os.listdir(f"{PROC}/{pid}/fd")
    except OSError:
        return
    for fd in fds:
        try:
            target = os.readlink(f"{PROC}/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/"):
            yield target
