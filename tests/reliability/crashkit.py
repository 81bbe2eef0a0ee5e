"""Crash harness: run a writer in a forked child and kill it with SIGKILL at its k-th write step.

A *step* is one call, on a path under the harness root, of: a file write (``write`` on a file
opened for writing), ``os.fsync``, ``os.replace``, ``os.rename``, ``os.mkdir``, ``os.unlink`` /
``os.remove``, ``os.rmdir``; plus explicit ``point(label)`` calls (a fake backend's submit). The
harness first runs the operation once to count and name its steps, then once per step with a kill
just BEFORE that step; a kill at a file write first writes half of the chunk (a torn write). A kill
after the last step is the run that completes. The parent then checks what a reader would see.

What this does not simulate: losing data that was written but not fsynced (a power cut). The
child's writes reach the page cache, which survives a process kill; power-cut ordering is argued in
``orchestrator/protocol/durable.py`` (fsync before rename, directory fsync after) rather than tested here.

The child is forked from the test process (no interpreter start, torch already imported), runs the
operation and leaves through ``os._exit``; it never returns into pytest.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_points: _Points | None = None


class _Points:
    def __init__(self, root: str, crash_at: int | None, fd: int) -> None:
        self.root = root
        self.crash_at = crash_at
        self.fd = fd
        self.n = 0

    def hit(self, label: str, before_kill: Callable[[], None] | None = None) -> None:
        k = self.n
        self.n += 1
        os.write(self.fd, f"{k}\t{label}\n".encode())
        if k == self.crash_at:
            if before_kill is not None:
                before_kill()
            os.kill(os.getpid(), signal.SIGKILL)


def point(label: str) -> None:
    """An explicit step (e.g. "the backend accepted the job"); a no-op outside the harness."""
    if _points is not None:
        _points.hit(label)


def _path_of(p: object, dir_fd: int | None = None) -> str:
    s = os.fsdecode(p) if isinstance(p, (str, bytes, os.PathLike)) else str(p)
    if dir_fd is not None and not os.path.isabs(s):
        with contextlib.suppress(OSError):
            s = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), s)
    return os.path.abspath(s)


class _CrashFile:
    """A file opened for writing under the root: every write is a step (torn on a kill)."""

    def __init__(self, f, label: str) -> None:
        self._f = f
        self._label = label

    def write(self, data):
        mv = memoryview(data).cast("B") if not isinstance(data, str) else None

        def torn() -> None:
            half = data[: len(data) // 2] if mv is None else mv[: mv.nbytes // 2]
            self._f.write(half)
            self._f.flush()

        _points.hit(f"write {self._label} ({len(data)} B)", before_kill=torn)
        return self._f.write(data)

    def __enter__(self) -> _CrashFile:
        self._f.__enter__()
        return self

    def __exit__(self, *exc: object) -> object:
        return self._f.__exit__(*exc)

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name: str) -> object:
        return getattr(self._f, name)


def _install(pts: _Points) -> None:
    global _points
    _points = pts
    root = pts.root

    def under(p: str) -> bool:
        return p == root or p.startswith(root + os.sep)

    def rel(p: str) -> str:
        return os.path.relpath(p, root)

    orig_open = builtins.open

    def open_(file, mode="r", *a, **kw):
        f = orig_open(file, mode, *a, **kw)
        if isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wxa+"):
            p = _path_of(file)
            if under(p):
                return _CrashFile(f, rel(p))
        return f

    builtins.open = open_

    orig_fsync = os.fsync

    def fsync(fd):
        fd = fd if isinstance(fd, int) else fd.fileno()
        try:
            p = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            p = "?"
        if under(p):
            pts.hit(f"fsync {rel(p)}")
        return orig_fsync(fd)

    os.fsync = fsync

    def wrap2(name: str) -> None:
        orig = getattr(os, name)

        def f(src, dst, *a, src_dir_fd=None, dst_dir_fd=None, **kw):
            s, d = _path_of(src, src_dir_fd), _path_of(dst, dst_dir_fd)
            if under(s) or under(d):
                pts.hit(f"{name} {rel(s)} -> {rel(d)}")
            return orig(src, dst, *a, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, **kw)

        setattr(os, name, f)

    def wrap1(name: str) -> None:
        orig = getattr(os, name)

        def f(path, *a, dir_fd=None, **kw):
            p = _path_of(path, dir_fd)
            if under(p):
                pts.hit(f"{name} {rel(p)}")
            return orig(path, *a, dir_fd=dir_fd, **kw)

        setattr(os, name, f)

    for n in ("replace", "rename"):
        wrap2(n)
    for n in ("mkdir", "unlink", "remove", "rmdir"):
        wrap1(n)


@dataclass
class Run:
    """How one child run ended: ``killed`` at step ``at`` (None: it completed), and its step labels."""

    killed: bool
    at: int | None
    labels: list[str]
    error: str = ""

    @property
    def completed(self) -> bool:
        return not self.killed and not self.error


def run(op: Callable[[], object], root: Path, crash_at: int | None = None, timeout_s: float = 60) -> Run:
    """Fork; in the child install the step counter on ``root`` and run ``op``; kill it before step ``crash_at``."""
    r, w = os.pipe()
    er, ew = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child: never returns
        code = 0
        try:
            os.close(r)
            os.close(er)
            _install(_Points(os.path.realpath(root), crash_at, w))
            op()
        except BaseException:
            with contextlib.suppress(BaseException):
                os.write(ew, traceback.format_exc().encode()[-4000:])
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    os.close(ew)
    import select
    import time

    chunks, errs = [], []
    deadline = time.monotonic() + timeout_s
    open_fds = {r, er}
    while open_fds:
        ready, _, _ = select.select(list(open_fds), [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            raise TimeoutError(f"crash child did not finish in {timeout_s}s")
        for fd in ready:
            b = os.read(fd, 65536)
            if not b:
                open_fds.discard(fd)
                os.close(fd)
            else:
                (chunks if fd == r else errs).append(b)
    _, status = os.waitpid(pid, 0)
    labels = [ln.split("\t", 1)[1] for ln in b"".join(chunks).decode().splitlines()]
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    err = b"".join(errs).decode(errors="replace")
    if not killed and os.waitstatus_to_exitcode(status) != 0 and not err:
        err = f"child exited {os.waitstatus_to_exitcode(status)}"
    return Run(killed=killed, at=crash_at if killed else None, labels=labels, error=err)


def kill_at_random(op: Callable[[], object], delay_s: float, root: Path) -> bool:
    """Fork ``op`` (which loops or runs long) and SIGKILL it after ``delay_s``; True if it was still running."""
    import time

    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            op()
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    time.sleep(delay_s)
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        assert os.waitstatus_to_exitcode(status) == 0, f"child failed before the kill (status {status})"
        return False
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return True


def snapshot_files(*roots: Path) -> dict[str, bytes]:
    """basename-independent content multiset: {sha256: count} of every regular file below roots."""
    import hashlib
    from collections import Counter

    c: Counter[str] = Counter()
    for root in roots:
        if not root.exists():
            continue
        for p in root.rglob("*"):
            if p.is_file() and not p.is_symlink():
                c[hashlib.sha256(p.read_bytes()).hexdigest()] += 1
    return dict(c)
