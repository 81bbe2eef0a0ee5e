"""An exclusive flock on a lock file orch owns (next to its DB, in ORCH_HOME, or in the runs root: the tracker locks),
bounded and naming its holder.

One helper for every such lock: the file is created 0600 and opened without following links, so a
symlink or directory planted there is refused rather than followed out of ORCH_HOME (hostile test).

Every wait is bounded (an ``orch sweep`` stopped with Ctrl-Z while it held the sweep launch lock made
every ``orch reconcile`` and ``orch requeue --failed`` block for good), and a holder that is stopped is not
waited for at all: it cannot let go by itself (a Ctrl-Z'd command holding the migrate lock cost
every command in its home 300 s, and one holding the launch lock cost every reconcile pass 30 s, though
the message already said "stopped"). The holder writes who it is (pid, host, command, since) into the
lock file once it has the lock; a waiter that gives up names it from that record, or from /proc/locks
when the record is missing or another process's. A lock this process already waited out once is then
tried only once more (a pass must not wait per sweep).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from orchestrator.errors import OrchError

DEFAULT_TIMEOUT_S = 30.0
_POLL_S = 0.05
_LOOK_S = 1.0  # how often a waiter looks whether the holder is stopped
_RECORD_LIMIT = 4096
_timed_out: set[str] = set()  # lock files this process already gave up on once


def lock_timeout_s(default: float = DEFAULT_TIMEOUT_S) -> float:
    """ORCH_LOCK_TIMEOUT_S, else ``default``: how long a command waits for one of orch's lock files."""
    try:
        v = float(os.environ.get("ORCH_LOCK_TIMEOUT_S", ""))
    except ValueError:
        return default
    return v if 0 <= v <= 86400 else default


class LockTimeout(OrchError):
    """Raised (as the caller's error class, mixed in) when the lock stayed held past the bound."""


@contextlib.contextmanager
def exclusive(path: Path, error: type[OrchError], what: str = "", timeout_s: float | None = None) -> Iterator[None]:
    """Hold ``flock(LOCK_EX)`` on ``path`` for the block, waiting at most ``timeout_s`` (default
    ``lock_timeout_s()``); ``error("cannot open <what><path>: ...")`` if it cannot be opened, and an
    error of both ``error`` and LockTimeout naming the holder when the bound passes."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise error(f"cannot open {what}{path}: {e.strerror or e}") from None
    try:
        bound = lock_timeout_s() if timeout_s is None else timeout_s
        got = _acquire(fd, path, 0.0 if str(path) in _timed_out else bound)
        if got is not True:
            _timed_out.add(str(path))
            why = (f"not waited for: a stopped holder cannot let go (resume it with kill -CONT {got}, or end it)"
                   if got is not False else f"gave up after {bound:g} s")
            raise _timeout_error(error)(f"{what}{path} is held by {holder(path, fd)}; {why}")
        _timed_out.discard(str(path))
        _write_record(fd)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # released: no stale record names a process that is gone
    finally:
        os.close(fd)


@functools.cache
def _timeout_error(error: type[OrchError]) -> type[OrchError]:
    """The caller's error class that is also a LockTimeout (callers that skip what a held lock blocks
    catch LockTimeout; the others keep handling their own class)."""
    if issubclass(LockTimeout, error):
        return LockTimeout
    return error if issubclass(error, LockTimeout) else type(error.__name__, (error, LockTimeout), {})


def _acquire(fd: int, path: Path, timeout_s: float) -> bool | int:
    """Poll a non-blocking flock until ``timeout_s`` has passed (flock itself has no timeout): True once
    taken, False at the bound, or the holder's pid at once when /proc/locks names a holder that is
    stopped (looked at on the first miss, then about once a second: one read of /proc/locks each)."""
    deadline = time.monotonic() + timeout_s
    look_at = 0.0
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            now = time.monotonic()
            if now >= look_at:
                pid = _proc_locks_holder(path)
                if pid is not None and pid != os.getpid() and _proc_state(pid) in ("T", "t"):
                    return pid
                look_at = now + _LOOK_S
            if now >= deadline:
                return False
            time.sleep(_POLL_S)


def _write_record(fd: int) -> None:
    """Who holds the lock now: informative only, so a write that fails costs nothing but the name."""
    rec = {"pid": os.getpid(), "host": socket.gethostname(), "command": _cmdline(os.getpid()),
           "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(rec).encode()[:_RECORD_LIMIT], 0)


def holder(path: Path, fd: int | None = None) -> str:
    """"pid N (command, stopped) on host H since T" for the lock's holder, as far as it can be found."""
    rec = _read_record(fd) if fd is not None else {}
    pid = _proc_locks_holder(path)
    if pid is None and isinstance(rec.get("pid"), int):
        pid = rec["pid"]
    if pid is None:
        return "an unknown process (no holder record, none in /proc/locks)"
    same = rec.get("pid") == pid
    cmd = _cmdline(pid) or (rec.get("command") if same and isinstance(rec.get("command"), str) else None) or "?"
    parts = [_printable(cmd)[:120]]
    if is_stopped(pid):
        parts.append("stopped")
    where = f" on {rec['host']}" if same and isinstance(rec.get("host"), str) else ""
    since = f" since {rec['since']}" if same and isinstance(rec.get("since"), str) else ""
    return f"pid {pid} ({', '.join(parts)}){where}{since}"


def _printable(text: str) -> str:
    """One line, whatever a command line holds (python -c with newlines; control characters)."""
    return "".join(c if c.isprintable() else " " for c in text)


def _read_record(fd: int) -> dict:
    try:
        data = os.pread(fd, _RECORD_LIMIT, 0)
        rec = json.loads(data.decode())
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def _proc_locks_holder(path: Path) -> int | None:
    """The pid /proc/locks gives for an FLOCK on ``path``'s inode (None if not found there)."""
    try:
        st = os.stat(path, follow_symlinks=False)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 12345 08:01:123456 0 EOF"; a blocked waiter's line has "->" first.
        if len(fields) >= 6 and fields[1] == "FLOCK" and "->" not in line and fields[5] == dev and fields[4].isdigit():
            return int(fields[4])
    return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return " ".join(a.decode(errors="replace") for a in f.read(4096).split(b"\0") if a)
    except OSError:
        return ""


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2:].split()[0].decode()
    except (OSError, ValueError, IndexError):
        return ""


def sqlite_writer(db_path: Path) -> str:
    """Best effort: the process holding SQLite's write lock on ``db_path``, as "pid N (command)" (", stopped"
    added for a stopped one), or '' when none can be named. For "database is locked" messages."""
    pid = sqlite_writer_pid(db_path)
    if pid is None:
        return ""  # e.g. a holder in another PID namespace, or a filesystem that does not show its locks
    return f"pid {pid} ({process_name(pid)}{', stopped' if is_stopped(pid) else ''})"


def sqlite_writer_pid(db_path: Path) -> int | None:
    """The pid holding SQLite's write lock on ``db_path`` as /proc/locks shows its POSIX locks (the WAL write
    lock is byte 120 of the -shm file; a rollback journal's are on the DB file itself), or None."""
    inodes: dict[str, str] = {}
    for suffix in ("", "-shm", "-wal"):
        try:
            st = os.stat(f"{db_path}{suffix}", follow_symlinks=False)
        except OSError:
            continue
        inodes[f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"] = suffix
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return None
    best: tuple[int, int] | None = None  # (rank, pid): the -shm write lock first
    for line in lines:
        fields = line.split()
        if len(fields) < 8 or "->" in line or fields[1] != "POSIX" or fields[3] != "WRITE":
            continue
        suffix = inodes.get(fields[5])
        if suffix is None or not fields[4].isdigit() or int(fields[4]) == os.getpid():
            continue
        rank = 0 if (suffix == "-shm" and fields[6] == "120") else 1 if suffix == "" else 2
        if best is None or rank < best[0]:
            best = (rank, int(fields[4]))
    return None if best is None else best[1]


def is_stopped(pid: int) -> bool:
    """Stopped by a signal (SIGSTOP, Ctrl-Z): it cannot let go of a lock until someone resumes it."""
    return _proc_state(pid) == "T"


def process_name(pid: int) -> str:
    """A process's command line on one printable line (at most 120 characters), or '?'."""
    return _printable(_cmdline(pid) or "?")[:120]
