"""A Slurm in-place rerun of one attempt: the earlier run's records set aside under ``*.prev-<k>``, the causes
of each restart, and how many were preemptions.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.protocol.durable import (
    atomic_write_json,
    fsync_dir,
    read_json_bounded,
)
from orchestrator.protocol.exitrecord import read_exit_at
from orchestrator.protocol.failure import read_failure_at
from orchestrator.protocol.layout import (
    EXIT_FILE,
    FAILURE_CLASSES,
    FAILURE_FILE,
    RESTART_CAUSES_FILE,
    WRAPPER_FILE,
    FailureClass,
    StopSource,
    attempt_dir,
)


def set_aside(path: Path) -> Path | None:
    """Rename ``path`` (e.g. ``failure.json``) to the first free ``<stem>.prev-<k><suffix>``.

    A Slurm in-place requeue reruns the same attempt: what its earlier run wrote must not be read
    as this run's record, and must not be lost either.
    """
    if not (path.exists() or path.is_symlink()):
        return None
    k = 1
    while (aside := path.with_name(aside_name(path.name, k))).exists():
        k += 1
    os.replace(path, aside)
    fsync_dir(path.parent)
    return aside

MAX_RESTARTS_SHOWN = 1000  # a job could set aside files forever; orch show reads a bounded number


def aside_name(name: str, k: int) -> str:
    """``failure.json`` -> ``failure.prev-<k>.json``: where :func:`set_aside` put the k-th earlier record."""
    stem, dot, suffix = name.rpartition(".")
    return f"{stem}.prev-{k}.{suffix}" if dot else f"{name}.prev-{k}"


RESTART_CAUSES_LIMIT = 64 * 1024


def write_restart_causes(attempt_path: Path, token: str, causes: Sequence[str | None]) -> bool:
    """Record the scheduler's cause of each earlier run of an attempt (oldest first; None: it gave none).

    Written only when it adds to what is stored (a longer list, or a cause where there was none), so a
    poll that knows less never erases what an earlier one learned. Returns whether it wrote.
    """
    stored = read_restart_causes(attempt_path, token)
    new = [c if c in FAILURE_CLASSES else None for c in list(causes)[:MAX_RESTARTS_SHOWN]]
    if len(new) < len(stored) or new == stored:
        return False
    new = [c if c is not None else (stored[k] if k < len(stored) else None) for k, c in enumerate(new)]
    if new == stored:
        return False
    attempt_path.mkdir(parents=True, exist_ok=True)
    atomic_write_json(attempt_path / RESTART_CAUSES_FILE, {"token": token, "causes": new})
    return True


def read_restart_causes(attempt_path: Path, token: str | None) -> list[str | None]:
    """The scheduler's causes of an attempt's earlier runs (see :func:`write_restart_causes`); [] when absent, of
    another token, or bad. The run dir is job-writable: only known failure classes are kept, others read None."""
    try:
        r = read_json_bounded(attempt_path / RESTART_CAUSES_FILE, limit=RESTART_CAUSES_LIMIT)
    except (OSError, ValueError):
        return []
    if not isinstance(r, dict) or not isinstance(r.get("causes"), list):
        return []
    if token is not None and r.get("token") != token:
        return []
    return [c if isinstance(c, str) and c in FAILURE_CLASSES else None for c in r["causes"][:MAX_RESTARTS_SHOWN]]


def restart_history(run_dir: Path | str, attempt: int, token: str | None = None) -> list[dict[str, Any]]:
    """Each in-place restart of one attempt (a Slurm requeue reruns the same attempt): why it stopped, at what step.

    Read from what the earlier runs left set aside: the program's ``failure.prev-<k>.json`` (class and step, when
    the program classified its stop) else the wrapper's ``exit.prev-<k>.json`` (a delivered stop signal means
    ``preempted``, the time limit ``timeout``; a plain exit ``unknown``). ``orch show`` prints them as
    ``restarts=1 (preempted at step 1358)``. Job-written, so validated like every other record.

    The scheduler's account (``restart_causes.json``, from Slurm's per-run State) wins over the program's class:
    the program sees only a stop signal, which a node failure and a preemption both send (a NODE_FAIL
    rerun in place was shown and counted as a preemption). Where the scheduler gave no cause, the records decide.
    """
    d = attempt_dir(run_dir, attempt)
    scheduler = read_restart_causes(d, token)
    out: list[dict[str, Any]] = []
    for k in range(1, MAX_RESTARTS_SHOWN + 1):
        said = scheduler[k - 1] if k <= len(scheduler) else None
        failure = read_failure_at(d / aside_name(FAILURE_FILE, k))
        ended = read_exit_at(d / aside_name(EXIT_FILE, k), token)
        if failure is None and ended is None:
            present = (d / aside_name(FAILURE_FILE, k)).exists() or (d / aside_name(EXIT_FILE, k)).exists()
            if not present and said is None:
                break
            # Unreadable records, or none (a failed node took the wrapper with it): the scheduler's word, if any.
            out.append({"restart": k, "class": said or "unknown", "step": None})
            continue
        if failure is not None:
            cls, step = failure["class"], failure.get("step")
        elif ended.time_limit_reached or ended.stop_source is StopSource.TIME_LIMIT:
            cls, step = "timeout", None
        else:
            cls, step = ("preempted" if ended.stop_signal else "unknown"), None
        out.append({"restart": k, "class": said or cls, "step": step})
    return out


def in_place_preemptions(history: list[dict[str, Any]], restarts: int) -> int:
    """How many of an attempt's ``restarts`` in-place restarts were preemptions: those whose history says
    ``preempted``, plus those with no record of why (Slurm requeues in place on preemption). One rule for
    ``orch show``, the metrics and goodput (a NODE_FAIL rerun was counted as a preemption)."""
    return sum(1 for h in history[:restarts] if h["class"] == FailureClass.PREEMPTED.value) + \
        max(0, restarts - len(history))


RUN_RECORD_LIMIT = 64 * 1024


def run_records(run_dir: Path | str, attempt: int, token: str | None) -> list[dict[str, Any]]:
    """The wrapper's start record of each run of one attempt, oldest first: ``wrapper.prev-<k>.json`` (run k-1,
    set aside when the next run began) then ``wrapper.json`` (the newest). ``{"run": r, "started_at": str | None}``
    per run; a run whose record is missing, unreadable or of another token has ``started_at`` None. Job-written:
    where a run began, never held time by itself.
    """
    d = attempt_dir(run_dir, attempt)
    names = []
    for k in range(1, MAX_RESTARTS_SHOWN + 1):
        if not (d / aside_name(WRAPPER_FILE, k)).exists():
            break
        names.append(aside_name(WRAPPER_FILE, k))
    names.append(WRAPPER_FILE)
    out = [{"run": r, "started_at": _run_start(d / name, token)} for r, name in enumerate(names)]
    if out[-1]["started_at"] is None and not (d / WRAPPER_FILE).exists():
        out.pop()  # the newest run has not started its program yet (or never will)
    return out


def first_run_start(run_dir: Path | str, attempt: int, token: str | None) -> str | None:
    """``started_at`` of the attempt's first run (``wrapper.prev-1.json`` once a restart set it aside, else
    ``wrapper.json``): one file read, where goodput needs no other run's (``run_records`` reads them all)."""
    d = attempt_dir(run_dir, attempt)
    first = d / aside_name(WRAPPER_FILE, 1)
    return _run_start(first if first.exists() else d / WRAPPER_FILE, token)


def _run_start(path: Path, token: str | None) -> str | None:
    try:
        w = read_json_bounded(path, limit=RUN_RECORD_LIMIT)
    except (OSError, ValueError):
        return None
    if not isinstance(w, dict) or (token is not None and w.get("token") != token):
        return None
    started = w.get("started_at")
    return started if isinstance(started, str) else None
