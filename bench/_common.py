"""Shared helpers for the bench scripts: machine description, statistics, BENCHMARKS.md sections.

Every bench script prints a table and replaces ITS OWN ``## ...`` section of BENCHMARKS.md (other
sections, e.g. the trainer's, are left byte for byte as they were). Ratios are always measured in
one run of one script against a baseline measured in the same run, so a slower or busier machine
moves both sides.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "BENCHMARKS.md"
VENV_BIN = ROOT / ".venv" / "bin"
PY = str(VENV_BIN / "python") if (VENV_BIN / "python").exists() else sys.executable
ORCH = str(VENV_BIN / "orch")

HEADER = """# Benchmarks

Each section is written by the script named in it (`.venv/bin/python bench/<script>.py`); rerun the
script to refresh its section. Figures are medians of repeated runs with the min-max range; ratios
are measured against a baseline in the same run of the same script.
"""


def add_quick(ap: object) -> None:
    """``--quick``: what CI runs (tests/bench/test_bench_quick.py) so that no bench script rots unseen: every
    code path once at tiny sizes, nothing written to BENCHMARKS.md; its figures mean nothing."""
    ap.add_argument("--quick", action="store_true",  # type: ignore[attr-defined]
                    help="smoke run for CI: tiny sizes, one repetition, BENCHMARKS.md left alone")


def ancestors() -> set[int]:
    """This process and every process above it (/proc/<pid>/stat's ppid): the pytest run, shell or flock that
    started a bench script is not "another user of the cluster" to wait for."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


# Pending for these reasons a job cannot take the node while a bench runs: held, asking for more nodes than the
# one-node dev cluster has, or not eligible before DORMANT_AFTER_S from now (a job Slurm requeued in place waits
# ~2 min for its BeginTime and does compete). CI met a 7-day --begin array a killed test run had left: both Slurm
# benches waited on it until their test's timeout.
_DORMANT_REASONS = {"JobHeldUser", "JobHeldAdmin", "PartitionNodeLimit"}
DORMANT_AFTER_S = 3600


def competing_jobs(ours: Callable[[str], bool] = lambda _jid: False) -> list[str]:
    """``squeue`` lines (id|state|reason|start|name) of jobs that hold the node or may start on it soon, except
    those ``ours(job id)`` claims; a bench waits for this to be empty."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%t|%r|%S|%j"], capture_output=True, text=True,
                         timeout=60).stdout
    return [ln for ln in out.splitlines() if ln.strip() and not ours(ln.split("|")[0]) and not _dormant(ln)]


def _dormant(line: str) -> bool:
    jid, state, reason, start = (line.split("|") + ["", "", "", ""])[:4]
    if state != "PD":
        return False
    if reason in _DORMANT_REASONS:
        return True
    if reason != "BeginTime":
        return False
    try:
        begins = time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:  # "N/A" or a format this Slurm does not print: count it as competing
        return False
    return begins - time.time() > DORMANT_AFTER_S


def machine() -> str:
    """One line: CPU model, cores, memory, OS, Python; from lscpu / nproc / /proc/meminfo."""
    model = platform.processor() or "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.M)
        if m:
            model = m.group(1).strip()
    mem = "?"
    with contextlib.suppress(OSError):
        m = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
        if m:
            mem = f"{int(m.group(1)) / 2**20:.0f} GiB"
    return (f"{model}, {os.cpu_count()} cores (nproc), {mem} RAM, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def today() -> str:
    return time.strftime("%Y-%m-%d %H:%M %Z")


def stats(xs: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(xs), min(xs), max(xs)


def fmt(xs: Sequence[float], unit: str = "ms", scale: float = 1e3, digits: int = 1) -> str:
    """``median (min-max) unit`` of a list of seconds (scaled to ``unit``)."""
    med, lo, hi = stats(xs)
    return f"{med * scale:.{digits}f} ({lo * scale:.{digits}f}–{hi * scale:.{digits}f}) {unit}"


def timeit(fn: Callable[[], object], runs: int, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


_LAUNCHER = r"""
import os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    finally:
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
sys.stderr.write("\n@@child %d %d %.6f %.6f\n" % (os.waitstatus_to_exitcode(status), ru.ru_maxrss,
                                                   time.perf_counter() - t0, ru.ru_utime + ru.ru_stime))
"""


def child_run(argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None,
              timeout: float = 600) -> tuple[int, float, int, str, str]:
    """Run ``argv``; return (returncode, wall seconds, peak RSS in KiB, stdout, stderr).

    The peak RSS comes from ``wait4`` in a tiny launcher (``python -S``, ~8 MiB): Linux carries a
    child's RSS high-water mark across fork and exec, so a child forked straight from this (large)
    bench process would report at least this process's RSS.
    """
    rc, wall, maxrss, _cpu, out, err = child_run_cpu(argv, env, cwd, timeout)
    return rc, wall, maxrss, out, err


def child_run_cpu(argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None,
                  timeout: float = 600) -> tuple[int, float, int, float, str, str]:
    """``child_run`` plus the child's CPU seconds (user + system, from ``wait4``): on a shared,
    busy machine the wall time waits for a core, the CPU time much less."""
    p = subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, *argv], capture_output=True, text=True,
                       env=env, cwd=cwd, timeout=timeout)
    err, _, tail = p.stderr.rpartition("\n@@child ")
    rc, maxrss, wall, cpu = tail.split()
    return int(rc), float(wall), int(maxrss), float(cpu), p.stdout, err


def mark(good: bool) -> str:
    """The goal column's verdict: " ✓" met, " ✗" not."""
    return " ✓" if good else " ✗"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-markdown table (also readable on a terminal)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells[1:]]
    return "\n".join(lines)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    fd = os.open(str(BENCHMARKS) + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(str(BENCHMARKS) + ".lock")


def replace_section(title: str, body: str, path: Path = BENCHMARKS, after: str | None = None) -> None:
    """Replace the ``## {title}`` section of BENCHMARKS.md; when absent, insert it right after the ``## {after}``
    section (a measured companion of a simulated one), else append it.

    A section runs from its heading to the next ``## `` heading; nothing else in the file changes.
    """
    heading = f"## {title}"
    with _locked():
        text = path.read_text() if path.exists() else HEADER
        lines = text.splitlines(keepends=True)
        start = next((i for i, ln in enumerate(lines) if ln.rstrip("\n") == heading), None)
        new = [heading + "\n", "\n", body.rstrip("\n") + "\n", "\n"]
        prev = next((i for i, ln in enumerate(lines) if after and ln.rstrip("\n") == f"## {after}"), None)
        if start is None and prev is not None:
            end = next((i for i in range(prev + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
            lines[end:end] = new if end < len(lines) else ["\n", *new]
        elif start is None:
            if lines and lines[-1].strip():
                lines[-1] = lines[-1] if lines[-1].endswith("\n") else lines[-1] + "\n"
                lines.append("\n")
            lines += new
        else:
            end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
            lines[start:end] = new
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(lines).rstrip("\n") + "\n")
        os.replace(tmp, path)


def preamble(script: str, notes: str = "") -> str:
    """The lines every section starts with: how to rerun it, when, on what."""
    s = f"`.venv/bin/python bench/{script}` — {today()} — {machine()}.\n"
    return s + (f"\n{notes.strip()}\n" if notes else "")
