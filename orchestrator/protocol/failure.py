"""The failure report a job writes when it stops (``failure.json``): its class, step and detail, and the
command of an attempt as orch recorded it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.protocol.durable import (
    MAX_DB_INT,
    atomic_write_json,
    finite_number,
    is_int,
    read_json_bounded,
)
from orchestrator.protocol.layout import (
    COMMAND_FILE,
    FAILURE_CLASSES,
    FAILURE_FILE,
    FailureClass,
    StopSource,
    attempt_dir,
    newest_attempt,
    now_iso,
)

FAILURE_LIMIT = 256 * 1024


def write_failure(run_dir: Path | str, attempt: int, cls: str, step: int | None, detail: str,
                  **extra: Any) -> Path:
    """Record why this attempt stopped: ``attempts/<n>/failure.json`` (atomic)."""
    if cls not in FAILURE_CLASSES:
        raise ValueError(f"unknown failure class {cls!r}")
    d = attempt_dir(run_dir, attempt)
    d.mkdir(parents=True, exist_ok=True)
    report = {"class": str(cls), "step": step, "detail": str(detail)[:2000], "at": now_iso(), **extra}
    path = d / FAILURE_FILE
    atomic_write_json(path, report)
    return path


def read_failure(run_dir: Path | str, attempt: int) -> dict | None:
    """The attempt's failure report if present and well formed; None otherwise (never raises).

    A report of an unknown class, or of the wrong shape, is treated as absent: the orchestrator then
    classifies from the backend, which is what it would do for a job that wrote nothing.
    """
    return read_failure_at(attempt_dir(run_dir, attempt) / FAILURE_FILE)


def last_attempt_command(run_dir: Path | str) -> tuple[int, list[str]] | None:
    """(n, argv) recorded in the highest-numbered ``attempts/<n>/command.json`` (written by orch
    before the launch, rewritten by the bundled trainer); None when there is none or it is not a
    small JSON object whose ``argv`` is a list of strings (the file is the job's to write)."""
    n = newest_attempt(run_dir)
    if n is None:
        return None
    try:
        rec = read_json_bounded(attempt_dir(run_dir, n) / COMMAND_FILE, limit=1 << 20)
    except (OSError, ValueError):
        return None
    argv = rec.get("argv") if isinstance(rec, dict) else None
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return None
    return n, argv


@dataclass(frozen=True)
class FailureReport:
    """``failure.json`` as orch reads it: the program's own word on why its attempt stopped."""

    cls: FailureClass
    step: int | None = None  # None when absent or out of range
    detail: str = ""
    lr: float | None = None  # the learning rate at that step, if the program said (a NaN rollback's fallback)

    @classmethod
    def parse(cls, r: object) -> FailureReport | None:
        """The one parse of a failure report (the file is the job's to write): None unless it is an object
        naming a known class; a step or lr of the wrong type or range reads as None."""
        if not isinstance(r, Mapping) or r.get("class") not in FAILURE_CLASSES:
            return None
        step = r.get("step")
        # A step outside [0, 2**31) would overflow attempts.failure_step (INTEGER: 64-bit on SQLite, 32-bit
        # on PostgreSQL) and crash every reconciler pass (tests/reliability, R4: {"step": 10**30}); a
        # negative one made the NaN rollback quarantine every checkpoint.
        step = step if step is not None and is_int(step, 0, MAX_DB_INT) else None
        # PostgreSQL refuses a NUL in text (SQLite stores it): one report with "\u0000" failed every pass.
        detail = str(r.get("detail", ""))[:2000].replace("\x00", "\\x00")
        return cls(FailureClass(r["class"]), step, detail, finite_number(r.get("lr")))


def read_failure_report(run_dir: Path | str, attempt: int) -> FailureReport | None:
    """The attempt's failure report, typed; None when absent or malformed (never raises)."""
    path = attempt_dir(run_dir, attempt) / FAILURE_FILE
    try:
        return FailureReport.parse(read_json_bounded(path, limit=FAILURE_LIMIT))
    except (OSError, ValueError):
        return None


def read_failure_at(path: Path) -> dict | None:
    """The report as a dict (the kit's and tests' view): the raw object with step and detail as parsed."""
    try:
        r = read_json_bounded(path, limit=FAILURE_LIMIT)
    except (OSError, ValueError):
        return None
    rep = FailureReport.parse(r)
    if rep is None:
        return None
    return {**r, "step": rep.step, "detail": rep.detail}


_STOP_SOURCES = frozenset(s.value for s in StopSource)


def stop_source(v: object) -> StopSource | None:
    return StopSource(v) if isinstance(v, str) and v in _STOP_SOURCES else None
