"""The heartbeat: ``progress.json`` (the newest), ``progress.jsonl`` (the curve), each rank's progress and
armed records, read back range-checked.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.protocol.durable import (
    atomic_write_json,
    finite_number,
    is_int,
    open_regular,
    read_json_bounded,
    read_tail,
    tmp_name,
)
from orchestrator.protocol.layout import (
    PROGRESS_FILE,
    PROGRESS_HISTORY,
    RANK_ARMED,
    RANK_ARMED_RE,
    RANK_PROGRESS,
    RANK_PROGRESS_RE,
    attempt_dir,
)

PROGRESS_LIMIT = 64 * 1024
HISTORY_TAIL_BYTES = 8 << 20  # the newest 8 MiB of a progress history (~100k heartbeats)

def write_progress(run_dir: Path | str, attempt: int, **fields: Any) -> None:
    """Heartbeat: ``attempts/<n>/progress.json`` rewritten atomically, and one line appended to
    ``progress.jsonl`` (the curve ``orch plot`` draws). Called from a heartbeat thread, never in the
    training step."""
    d = attempt_dir(run_dir, attempt)
    d.mkdir(parents=True, exist_ok=True)
    record = {"time": time.time(), **fields}
    atomic_write_json(d / PROGRESS_FILE, record)
    append_history(d / PROGRESS_HISTORY, record)


def write_rank_progress(run_dir: Path | str, attempt: int, rank: int, step: int | None) -> None:
    """A non-zero rank's heartbeat: ``attempts/<n>/progress.rank-<r>.json`` replaced by a rename, NOT fsynced.

    Cheap on purpose (every rank, every heartbeat): the hang detector reads when it was written (its mtime)
    and the step in it; a crash that lost the last one only makes the rank look older, and a crashed
    attempt is judged by its exit, not by its heartbeats. No history line: rank 0's progress.jsonl is the curve.
    """
    _write_rank_file(run_dir, attempt, RANK_PROGRESS.format(int(rank)), {"rank": int(rank), "step": step})


def _write_rank_file(run_dir: Path | str, attempt: int, name: str, record: dict[str, Any]) -> None:
    """One rank's small record (with the time) in the attempt dir, replaced by a rename, not fsynced."""
    d = attempt_dir(run_dir, attempt)
    d.mkdir(parents=True, exist_ok=True)  # a script run without orch (run_dir=) has no attempt dir yet
    path = d / name
    tmp = path.with_name(tmp_name(path.name))
    try:
        tmp.write_text(json.dumps({**record, "time": time.time()}) + "\n")
        os.replace(tmp, path)
    except OSError:
        # A directory put at ``path`` (hostile pass 4) left one tmp file per heartbeat in the attempt dir.
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


MAX_WORLD = 10**7  # ranks in one job: a bound on a job-written world size, not a limit anyone meets


def write_rank_armed(run_dir: Path | str, attempt: int, rank: int, world: int, since: float) -> None:
    """A rank of a multi-rank job says, as its program starts, that it will beat (``attempts/<n>/armed.rank-<r>.json``;
    a rename, not fsynced: its loss only leaves the rank's start unjudged, as before). Rewritten every heartbeat
    interval until the rank first beats: its mtime says the program is still alive in its start; ``since`` (the
    first arming, the job's clock) says when its imports were done."""
    _write_rank_file(run_dir, attempt, RANK_ARMED.format(int(rank)),
                     {"rank": int(rank), "world_size": int(world), "since": since})


@dataclass(frozen=True)
class ArmedRank:
    """One rank's armed record, checked."""

    world: int  # the world size it was started in
    since: float | None  # when it first armed (the job's clock); None in a record without it


def read_armed(run_dir: Path | str, attempt: int) -> dict[int, ArmedRank]:
    """rank -> its armed record, for each rank that armed (one directory listing; each record read bounded, as every
    job-written file is; a bad one is skipped)."""
    d = attempt_dir(run_dir, attempt)
    try:
        names = os.listdir(d)
    except OSError:
        return {}
    out: dict[int, ArmedRank] = {}
    for name in names:
        if not RANK_ARMED_RE.fullmatch(name):
            continue
        try:
            r = read_json_bounded(d / name, limit=4096)
        except (OSError, ValueError):
            continue
        world = r.get("world_size") if isinstance(r, dict) else None
        if is_int(world, 2, MAX_WORLD) and is_int(r.get("rank"), 0, world - 1) and \
                name == RANK_ARMED.format(r["rank"]):
            out[r["rank"]] = ArmedRank(world, finite_number(r.get("since")))
    return out


def armed_ranks(run_dir: Path | str, attempt: int) -> dict[int, int]:
    """rank -> the world size it was started in, for each rank that armed (``read_armed``)."""
    return {rank: a.world for rank, a in read_armed(run_dir, attempt).items()}


def progress_files(run_dir: Path | str, attempt: int, world: int) -> dict[int, Path]:
    """Every rank's heartbeat file of the attempt: rank 0's ``progress.json`` (whether it exists or not), and
    when rank 0's heartbeat says there are several ranks (``world``), each ``progress.rank-<r>.json`` that
    exists (one directory listing; none for a one-process job, whose cost is what it always was)."""
    d = attempt_dir(run_dir, attempt)
    out: dict[int, Path] = {0: d / PROGRESS_FILE}
    if world <= 1:
        return out
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return out
    for name in names:
        m = RANK_PROGRESS_RE.fullmatch(name)
        if m and int(m.group(1)) > 0:
            out[int(m.group(1))] = d / name
    return out


def read_step(path: Path) -> int | None:
    """The ``step`` of one rank's heartbeat file, range-checked; None when absent, unreadable or not a step."""
    try:
        r = read_json_bounded(path, limit=PROGRESS_LIMIT)
    except (OSError, ValueError):
        return None
    step = r.get("step") if isinstance(r, dict) else None
    return step if is_int(step, 0) else None


def append_history(path: Path, record: Mapping[str, Any]) -> None:
    """Append one JSON line with a single ``write`` on an O_APPEND fd, then fsync.

    Crash-safe by construction: a crash leaves at worst a torn LAST line, which the reader skips;
    earlier lines are never rewritten. Each line is far below PIPE_BUF-scale sizes, so concurrent
    appenders (a Slurm rerun's heartbeat beside a late writer) do not interleave within a line.
    """
    line = (json.dumps(record, sort_keys=True, default=str, allow_nan=False) + "\n").encode()
    # Only a regular file: a FIFO put there (hostile pass 4) blocked the kit's heartbeat thread in open() for good,
    # so progress.json froze while training went on, and the job was stopped as hung.
    f = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    if f is None:
        raise OSError(errno.EINVAL, f"{Path(path).name} is not a regular file; not appended to")
    with f:
        f.write(line)
        os.fsync(f.fileno())


_PROGRESS_NUMBERS = ("loss", "tokens_per_s", "tokens_per_s_recent", "tokens_per_s_median", "time", "lr",
                     "eval_loss", "grad_norm")
# resumed_from: the step this attempt started from (0 when fresh); `orch metrics` compares it with the
# previous attempt's last step to count the steps a preemption made it redo.
# world_size: rank 0's heartbeat of a multi-rank job: the other ranks write progress.rank-<r>.json.
_PROGRESS_INTS = ("step", "max_steps", "saved_step", "samples", "tokens_per_step", "epoch", "resumed_from",
                  "world_size")


def clean_progress(r: Any) -> dict | None:
    """A heartbeat record with every known field type- and range-checked; bad fields are dropped.

    One progress.json holding ``{"step": "x"}`` or ``1e999`` made ``orch status`` fail for every job.
    """
    if not isinstance(r, dict):
        return None
    out: dict[str, Any] = {}
    for k in _PROGRESS_NUMBERS:
        v = finite_number(r.get(k))
        if v is not None:
            out[k] = v
    for k in _PROGRESS_INTS:
        if is_int(r.get(k), 0):
            out[k] = r[k]
    known = (*_PROGRESS_NUMBERS, *_PROGRESS_INTS)
    for k, v in r.items():  # extra fields a script posts: kept when plain and small
        if k not in known and isinstance(k, str) and len(k) <= 64 and (
                (isinstance(v, str) and len(v) <= 200) or isinstance(v, bool) or finite_number(v) is not None):
            out[k] = v
    return out


def read_progress(run_dir: Path | str, attempt: int) -> dict | None:
    """The latest heartbeat, cleaned (see ``clean_progress``); None when absent or unreadable."""
    try:
        r = read_json_bounded(attempt_dir(run_dir, attempt) / PROGRESS_FILE, limit=PROGRESS_LIMIT)
    except (OSError, ValueError):
        return None
    return clean_progress(r)


def read_history_head(run_dir: Path | str, attempt: int, limit: int = 64 * 1024) -> dict | None:
    """The FIRST heartbeat of an attempt (the history's first line, cleaned), None when absent or unreadable.

    Opened as every job-written file is (O_NONBLOCK, O_NOFOLLOW, a regular file only, ``limit`` bytes): the
    hang judge reads it on each pass, and a FIFO named progress.jsonl would otherwise block every pass.
    """
    path = attempt_dir(run_dir, attempt) / PROGRESS_HISTORY
    try:
        f = open_regular(path)
    except OSError:
        return None
    if f is None:
        return None
    with f:
        first = f.read(limit).split(b"\n", 1)[0]
    try:
        return clean_progress(json.loads(first, parse_constant=float))
    except (ValueError, RecursionError):
        return None


def read_progress_history(run_dir: Path | str, attempt: int) -> list[dict]:
    """Every heartbeat of an attempt, oldest first (the newest HISTORY_TAIL_BYTES of them).

    Torn or malformed lines (a crash mid-append, a job's garbage) are skipped, never fatal.
    """
    got = read_tail(attempt_dir(run_dir, attempt) / PROGRESS_HISTORY, HISTORY_TAIL_BYTES)
    if got is None:
        return []
    raw, cut = got
    lines = raw.split(b"\n")
    if cut:
        lines = lines[1:]  # the first line of the tail is probably cut
    return [rec for line in lines if (rec := history_record(line))]


def history_record(line: bytes) -> dict | None:
    """One line of a progress history, cleaned; None for a torn, malformed or empty one."""
    try:
        return clean_progress(json.loads(line, parse_constant=float)) or None
    except (ValueError, RecursionError):
        return None
