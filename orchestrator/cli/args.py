"""Argument-only checks: they run at parse time, before any row, directory or file exists (lesson 2).

Each raises ``click.BadParameter`` (exit 2, one line). The values that reach sbatch are checked
here with the backend's own validators, so a bad one is refused before the job row exists.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import click

# ------------------------------------------------------------------------------------------
# argument-only validation (before any row or directory exists)
# ------------------------------------------------------------------------------------------
# Bounded digit runs: int() of a 5000-digit string raises ValueError (exit 1 instead of 2).
# ASCII only: under re.I the Kelvin sign (U+212A) matched [K] and then missed the unit table (a
# KeyError, exit 1); \d also matched other scripts' digits.
_MEM_RE = re.compile(r"^(\d{1,20})([KMGT]?)B?$", re.I | re.ASCII)
MAX_MEM_MB = 2**43  # its size in bytes still fits a signed 64-bit integer (Slurm, the DB)
MAX_TIME_S = (2**32 - 2) * 60  # Slurm keeps a time limit in minutes in a uint32 (all ones = INFINITE)
_TIME_RE = re.compile(r"^(?:(\d{1,12})-)?(\d{1,12})(?::(\d{1,12}))?(?::(\d{1,12}))?$", re.ASCII)


def parse_mem_mb(value: str) -> int:
    """Slurm-style memory (``500M``, ``4G``, ``1T``; a bare number is MB) in MB."""
    m = _MEM_RE.match(value.strip())
    if not m or int(m.group(1)) == 0:
        raise click.BadParameter(f"{value!r} is not a memory size like 500M, 4G or 1T", param_hint="--mem")
    n, unit = int(m.group(1)), m.group(2).upper()
    mb = {"K": n // 1024, "": n, "M": n, "G": n * 1024, "T": n * 1024 * 1024}[unit]
    # Refused here rather than by sbatch after the job row exists (and the reconciler would retry
    # the launch every pass); "9"*400+"K" also overflowed the float division (exit 1, not 2).
    if mb > MAX_MEM_MB:
        raise click.BadParameter(f"{value!r} is more than {MAX_MEM_MB} MB", param_hint="--mem")
    return max(1, mb)


def parse_time_s(value: str) -> int:
    """Slurm time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS -> seconds."""
    m = _TIME_RE.match(value.strip())
    if not m:
        raise click.BadParameter(f"{value!r} is not a time like 30, 1:30:00 or 2-00:00:00", param_hint="--time")
    d, a, b, c = m.groups()
    if d is not None:  # D-HH[:MM[:SS]]
        secs = int(d) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
        parts = [int(b or 0), int(c or 0)]
    elif c is not None:  # HH:MM:SS
        secs, parts = int(a) * 3600 + int(b) * 60 + int(c), [int(b), int(c)]
    elif b is not None:  # MM:SS
        secs, parts = int(a) * 60 + int(b), [int(b)]
    else:  # MM
        secs, parts = int(a) * 60, []
    if any(p >= 60 for p in parts) or secs <= 0:
        raise click.BadParameter(f"{value!r} is not a valid positive time", param_hint="--time")
    if secs > MAX_TIME_S:
        raise click.BadParameter(f"{value!r} is longer than Slurm can express", param_hint="--time")
    return secs


def _name_cb(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from orchestrator.protocol import UnsafePath, validate_job_name

    try:
        return validate_job_name(value)
    except UnsafePath as e:
        raise click.BadParameter(str(e)) from None


def _outputs_cb(_ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    for g in value:
        parts = g.split("/")
        # An output glob that leaves the run dir would let the marker vouch for files orch doesn't own.
        if not g or g.startswith("/") or ".." in parts or "\x00" in g or "\n" in g:
            raise click.BadParameter(f"{g!r} must be a relative glob inside the run dir (no '/...' or '..')")
        # The run dir itself, or orch's own records, can never be a result: `--outputs .` used to be
        # refused only at launch, after the job row existed (issue 9).
        first = os.path.normpath(g).split("/")[0]
        if first in (".", "attempts", "checkpoints") or os.path.normpath(g) == "done.json":
            raise click.BadParameter(f"{g!r} names the run dir itself or orch's own files; name result files",
                                     param_hint="--outputs")
    return value


def _plain_cb(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # Values that end up in sbatch directives: a newline or '#' could smuggle an #SBATCH line.
    # fullmatch: with re.match, "$" also matches before a trailing newline ("gpu\n" passed).
    if value is not None and not re.fullmatch(r"[A-Za-z0-9._,:=@/+-]+", value):
        raise click.BadParameter(f"{value!r} contains characters not allowed in --{param.name}")
    return value


def _absolute_program(cmd: tuple[str, ...]) -> tuple[str, ...]:
    """A relative program path (``.venv/bin/python``) means the submitter's cwd, not the run dir the
    job runs in; bare names (``python``) are looked up on PATH by the job, as usual."""
    prog = cmd[0]
    if "/" in prog and not os.path.isabs(prog):
        prog = os.path.abspath(prog)
    return (prog, *cmd[1:])


def _default_name(cmd: tuple[str, ...]) -> str:
    import secrets

    base = re.sub(r"[^A-Za-z0-9._-]", "-", Path(cmd[0]).name)[:40].strip(".-") or "job"
    if base in ("python", "python3") and len(cmd) > 2 and cmd[1] == "-m":
        base = re.sub(r"[^A-Za-z0-9._-]", "-", cmd[2])[:40] or base
    return f"{base}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


