"""Helpers of the adversarial suite: find a job's processes the way the kernel sees them,
sample them in the background, settle the reconciler and check that nothing is left stuck.

Importable as ``advkit`` from the test modules of this folder (pytest puts the folder on sys.path).
Nothing here mocks orch: processes are found by scanning /proc, states are read through the CLI.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from orchkit import IN_CI, PY, ROOT, tree_hash, unavailable, wait_for

ADVJOB = Path(__file__).resolve().with_name("advjob.py")
LIVE_STATES = ("pending", "submitted", "running")
SETTLED_STATES = ("done_marker_verified", "failed", "cancelled", "retryable_failed")
FINAL_STATES = ("done_marker_verified", "failed", "cancelled")


def need_root() -> None:
    """Root-only tests: a failure under CI (a skip there would hide the test), a skip elsewhere."""
    if os.geteuid() == 0:
        return
    if IN_CI:
        pytest.fail("this test needs root (mount namespaces / tmpfs); CI=true must not skip it")
    pytest.skip("needs root (mount namespaces / tmpfs)")


# ------------------------------------------------------------------------------------------
# processes of a job, by /proc scan
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobProc:
    pid: int
    run_dir: str
    attempt: str | None
    token: str | None
    wrapper: bool  # orch's job wrapper (found by its argv), else a process of the job (by environ)


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # vanished, or a kernel thread / a process we may not read
        return None


def _argv_value(argv: list[str], flag: str) -> str | None:
    try:
        return argv[argv.index(flag) + 1]
    except (ValueError, IndexError):
        return None


def scan_procs(match: Callable[[str], bool]) -> list[JobProc]:
    """Every live process whose ORCH_RUN_DIR (or, for orch's wrapper, ``--run-dir``) satisfies ``match``."""
    me = os.getpid()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        env = _read(f"/proc/{d}/environ")
        if not env:  # zombies and kernel threads have none
            continue
        vals = {}
        for item in env.split(b"\0"):
            if item.startswith(b"ORCH_"):
                k, _, v = item.partition(b"=")
                vals[k.decode(errors="replace")] = v.decode(errors="replace")
        rd = vals.get("ORCH_RUN_DIR")
        if rd is not None and match(rd):
            out.append(JobProc(int(d), rd, vals.get("ORCH_ATTEMPT"), vals.get("ORCH_SUBMIT_TOKEN"), False))
            continue
        cmd = _read(f"/proc/{d}/cmdline") or b""
        if b"orchestrator.jobside.wrapper" not in cmd:
            continue
        argv = [a.decode(errors="replace") for a in cmd.split(b"\0")]
        rd = _argv_value(argv, "--run-dir")
        if rd is not None and match(rd):
            out.append(JobProc(int(d), rd, _argv_value(argv, "--attempt"), _argv_value(argv, "--token"), True))
    return out


def _same_dir(a: str, b: str) -> bool:
    return a == b or os.path.realpath(a) == os.path.realpath(b)


def live_job_procs(run_dir: Path | str) -> list[JobProc]:
    rd = str(run_dir)
    return scan_procs(lambda d: _same_dir(d, rd))


def live_job_pids(run_dir: Path | str) -> set[int]:
    return {p.pid for p in live_job_procs(run_dir)}


def wrapper_pids(run_dir: Path | str) -> set[int]:
    return {p.pid for p in live_job_procs(run_dir) if p.wrapper}


def procs_under(prefix: Path | str) -> list[JobProc]:
    pre = str(prefix).rstrip("/") + "/"
    return scan_procs(lambda d: d.startswith(pre) or os.path.realpath(d).startswith(pre))


def kill_pids(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def pid_alive(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return False
    return stat.rsplit(b")", 1)[-1].split()[0] != b"Z"


@dataclass(frozen=True)
class Sample:
    t: float
    pids: frozenset[int]
    attempts: frozenset[str | None]
    tokens: frozenset[str | None]

    @property
    def alive(self) -> bool:
        return bool(self.pids)


class ProcessSampler:
    """Every ~50 ms: which attempts (and which launches, by submit token) of one run dir are alive.

    The invariant: at most one live process tree per job at EVERY sample. Two distinct
    ORCH_ATTEMPT values, or two distinct tokens (a fresh DB starts a second "attempt 1"), is a
    double run, however briefly it lasted.
    """

    def __init__(self, run_dir: Path | str, interval: float = 0.05) -> None:
        self.run_dir = str(run_dir)
        self.interval = interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"sampler {self.run_dir}")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            procs = live_job_procs(self.run_dir)
            self.samples.append(Sample(time.time(), frozenset(p.pid for p in procs),
                                       frozenset(p.attempt for p in procs),
                                       frozenset(p.token for p in procs if p.token is not None)))
            self._stop.wait(self.interval)

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.samples

    def __enter__(self) -> ProcessSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def assert_never_two_attempts(self) -> None:
        assert self.samples, "the sampler took no sample"
        for s in self.samples:
            assert len(s.attempts) <= 1 and len(s.tokens) <= 1, (
                f"two live process trees for {self.run_dir} at t={s.t:.2f}: attempts {sorted(map(str, s.attempts))}, "
                f"tokens {sorted(map(str, s.tokens))}, pids {sorted(s.pids)}")

    def ever_alive(self) -> bool:
        return any(s.alive for s in self.samples)


def wait_no_procs(run_dir: Path | str, timeout: float, what: str = "") -> None:
    def gone() -> bool:
        return not live_job_procs(run_dir)
    try:
        wait_for(gone, timeout, f"no process of {run_dir} alive {what}".strip(), interval=0.1)
    except AssertionError as e:
        raise AssertionError(f"{e}; still alive: {live_job_procs(run_dir)}") from None


# ------------------------------------------------------------------------------------------
# orch through its CLI
# ------------------------------------------------------------------------------------------
def orch_popen(orch, *args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    """``orch ARGS`` in the background (the caller waits on it, a finalizer kills it)."""
    return subprocess.Popen([PY, "-m", "orchestrator.cli", *map(str, args)], env={**orch.env, **(env or {})},
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def job_argv(*args: str) -> list[str]:
    """The hostile test job (advjob.py) as a command for ``orch submit --``."""
    return [PY, str(ADVJOB), *map(str, args)]


def status_map(orch, env: dict | None = None) -> dict[str, dict]:
    p = orch("status", "--json", timeout=30, env=env)
    assert p.returncode == 0, f"orch status --json exited {p.returncode}: {p.stderr}"
    return {r["name"]: r for r in json.loads(p.stdout)}


def show(orch, name: str, env: dict | None = None) -> dict:
    p = orch("show", name, "--json", timeout=30, env=env)
    assert p.returncode == 0, f"orch show {name} --json exited {p.returncode}: {p.stderr}"
    return json.loads(p.stdout)


def reconcile_ok(orch, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    """One pass that must return within ``timeout`` and exit 0 (a hung pass hangs every job)."""
    try:
        p = orch("reconcile", timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"orch reconcile did not return within {timeout}s (a pass blocked)") from None
    assert p.returncode == 0, f"orch reconcile exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return p


def _db_snapshot(orch) -> list | None:
    """(name, state, attempts) of every job, read with sqlite3: a cheap way to see whether a pass
    changed anything (every `orch status` costs a Python start-up on a 2-core CI machine)."""
    db = orch.home / "orch.db"
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as c:
            return sorted(c.execute("SELECT j.name, j.state, (SELECT count(*) FROM attempts a WHERE a.job_id = j.id) "
                                    "FROM jobs j"))
    except sqlite3.Error:
        return None


def settle(orch, names: Iterable[str] | None = None, timeout: float = 60, env: dict | None = None,
           pause: float = 0.3) -> dict[str, dict]:
    """Reconcile until every watched job (default: all) is final, or until nothing changed for 2
    consecutive passes while no watched job still has a live process (a running job is waited for:
    what the reconciler started by itself, e.g. a requeued attempt, must end before "settled").
    Returns `orch status --json` by name."""
    names = list(names) if names is not None else None
    deadline = time.monotonic() + timeout
    history: list = []
    rows = status_map(orch, env=env)
    while True:
        # Processes are looked at BEFORE the pass: a job whose last process exits during the scan
        # is then seen ended by the pass that follows, never taken for "settled while running".
        running = [n for n, r in rows.items() if (names is None or n in names) and live_job_procs(r["run_dir"])]
        reconcile_ok(orch, env=env)
        snap = _db_snapshot(orch)
        if snap is None:
            snap = sorted((n, r["state"], r["attempts"]) for n, r in status_map(orch, env=env).items())
        history.append(snap)
        states = {n: st for n, st, _k in snap}
        watched = [n for n in (names if names is not None else states) if n in states]
        stable = len(history) >= 3 and history[-1] == history[-2] == history[-3] and not running
        if stable or (watched and all(states[n] in FINAL_STATES for n in watched)):
            return status_map(orch, env=env)
        if time.monotonic() > deadline:
            raise AssertionError(f"orch did not settle within {timeout}s: {snap}; still running: {running}")
        if len(history) == 1 or history[-1] != history[-2]:
            rows = status_map(orch, env=env)  # new jobs or attempts: their run dirs
        time.sleep(pause)


def _stuck(orch, env: dict | None = None) -> list[str]:
    problems = []
    rows = status_map(orch, env=env)
    for name, row in rows.items():
        if row["state"] in LIVE_STATES and not live_job_procs(row["run_dir"]):
            problems.append(f"{name} is {row['state']} but no process of it is alive")
    for r in orch_parallel(orch, [["show", name, "--json"] for name in rows], env=env):
        assert r.returncode == 0, f"orch {' '.join(r.args)} exited {r.returncode}: {r.stderr}"
        d = json.loads(r.stdout)
        if d["state"] in SETTLED_STATES:
            left = [(a["n"], a["state"]) for a in d["attempts"] if a["state"] in LIVE_STATES]
            if left:
                problems.append(f"{d['name']} is {d['state']} but attempts {left} are still open")
    return problems


def assert_no_stuck(orch, env: dict | None = None, retries: int = 3) -> None:
    """After settling: every pending/submitted/running job has a live process, and no settled job
    keeps an attempt open. A job whose last process exited a moment ago gets a few more passes."""
    problems = _stuck(orch, env)
    for _ in range(retries):
        if not problems:
            return
        time.sleep(0.5)
        reconcile_ok(orch, env=env)
        problems = _stuck(orch, env)
    assert not problems, "stuck after settling: " + "; ".join(problems)


def db_job_names(home: Path) -> list[str]:
    """Job rows as stored, read with sqlite3 (no orch code, and no DB created when there is none)."""
    db = home / "orch.db"
    if not db.exists():
        return []
    with sqlite3.connect(db) as c:
        try:
            return [r[0] for r in c.execute("SELECT name FROM jobs")]
        except sqlite3.OperationalError:  # no schema yet
            return []


def one_line_error(stderr: str) -> None:
    """A user error is one line on stderr, never a traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {stderr!r}"


# ------------------------------------------------------------------------------------------
# nothing outside ORCH_HOME
# ------------------------------------------------------------------------------------------
class Sentinel:
    """A tree outside ORCH_HOME with known content: a stray write, move or delete changes its hash."""

    def __init__(self, path: Path) -> None:
        self.path = path
        (path / "sub").mkdir(parents=True, exist_ok=True)
        (path / "secret.txt").write_text("must never change\n")
        (path / "sub" / "data.bin").write_bytes(os.urandom(2048))
        self.hash = tree_hash(path)

    def assert_untouched(self) -> None:
        now = tree_hash(self.path)
        if now != self.hash:
            listing = sorted(str(p.relative_to(self.path)) for p in self.path.rglob("*"))
            raise AssertionError(f"orch wrote outside ORCH_HOME, in {self.path}: {listing}")


def outside_sentinel(tmp_path: Path, name: str = "outside") -> Sentinel:
    return Sentinel(tmp_path / name)


def flip_byte(path: Path) -> None:
    """Flip one byte in the middle of a file; the size stays the same (only a hash can tell)."""
    size = path.stat().st_size
    assert size > 0
    with open(path, "r+b") as f:
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())
    assert path.stat().st_size == size


def orch_parallel(orch, argvs: list[list[str]], timeout: float = 30,
                  env: dict | None = None) -> list[subprocess.CompletedProcess]:
    """Several orch commands at once, at most 4 at a time (each must return within ``timeout``)."""
    out = []
    for i in range(0, len(argvs), 4):
        out += _orch_batch(orch, argvs[i:i + 4], timeout, env)
    return out


def _orch_batch(orch, argvs: list[list[str]], timeout: float, env: dict | None) -> list:
    procs = [(a, orch_popen(orch, *a, env=env)) for a in argvs]
    out = []
    for a, p in procs:
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for _a, q in procs:
                q.kill()
            raise AssertionError(f"orch {' '.join(a)} did not return within {timeout}s") from None
        out.append(subprocess.CompletedProcess(a, p.returncode, so, se))
    return out


def make_home(orch) -> None:
    """ORCH_HOME as orch itself would create it (0700), for tests that plant things before orch runs."""
    orch.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(orch.home, 0o700)


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A real small filesystem (root only), unmounted in a finalizer whatever the test did."""
    need_root()
    where.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if p.returncode:
        unavailable(f"running as root but mount -t tmpfs failed: {p.stderr.strip()}")
    try:
        yield where
    finally:
        kill_pids(p.pid for p in procs_under(where))
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill_fs(path: Path) -> None:
    """Write ``path`` until the filesystem it is on says ENOSPC (unbuffered: nothing pending)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                os.write(fd, b"\0" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                return
    finally:
        os.close(fd)


def assert_user_error(p: subprocess.CompletedProcess, codes: Iterable[int], pattern: str | None = None) -> str:
    """Exit code in ``codes``, no traceback, and stderr is ONE line matching ``pattern`` (case-insensitive);
    a usage error too (click's own three lines, usage banner, hint and error, are one since stop 18).
    Returns the error line."""
    codes = tuple(codes)
    assert p.returncode in codes, f"exit {p.returncode}, wanted {codes}:\n{p.stdout}\n{p.stderr}"
    assert "Traceback" not in p.stderr, p.stderr
    errs = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(errs) == 1, f"expected one error line on stderr, got {len(errs)}: {p.stderr!r}"
    if pattern is not None:
        assert re.search(pattern, errs[0], re.I), f"{pattern!r} not in {errs[0]!r}"
    return errs[0]
