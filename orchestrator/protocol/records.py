"""Records an attempt leaves: failure report and heartbeat (the job), exit record (orch's wrapper).

The job can write every one of these files, so each reader type- and range-checks every field and
returns None (or drops the field) rather than trusting it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.protocol.durable import (
    MAX_DB_INT,
    SyncBatch,
    atomic_create,
    atomic_write_json,
    finite_number,
    fsync_dir,
    is_int,
    open_regular,
    read_json_bounded,
    tmp_name,
)
from orchestrator.protocol.layout import (
    ATTEMPTS_DIR,
    BATCHES_DIR,
    CHECKPOINTS_DIR,
    COMMAND_FILE,
    COMPLETE_FILE,
    EXIT_FILE,
    FAILURE_CLASSES,
    FAILURE_FILE,
    FENCE_FILE,
    OWN_CHECKPOINT_RE,
    PROGRESS_FILE,
    PROGRESS_HISTORY,
    RANK_ARMED,
    RANK_ARMED_RE,
    RANK_PROGRESS,
    RANK_PROGRESS_RE,
    RESTART_CAUSES_FILE,
    RESULT_DIR,
    RUN_CONFIG,
    STOP_FILE,
    FailureClass,
    StopSource,
    UnsafePath,
    attempt_dir,
    now_iso,
    resolve_inside,
    safe_relpath,
)

# =========================================================================================
# records an attempt leaves: failure report (the job), heartbeat (the job), exit record (the wrapper)
# =========================================================================================
FAILURE_LIMIT = 256 * 1024
PROGRESS_LIMIT = 64 * 1024
EXIT_LIMIT = 64 * 1024
RUN_CONFIG_LIMIT = 1 << 20
HISTORY_TAIL_BYTES = 8 << 20  # the newest 8 MiB of a progress history (~100k heartbeats)


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
    return _read_failure_at(attempt_dir(run_dir, attempt) / FAILURE_FILE)


def last_attempt_command(run_dir: Path | str) -> tuple[int, list[str]] | None:
    """(n, argv) recorded in the highest-numbered ``attempts/<n>/command.json`` (written by orch
    before the launch, rewritten by the bundled trainer); None when there is none or it is not a
    small JSON object whose ``argv`` is a list of strings (the file is the job's to write)."""
    try:
        numbers = [int(d.name) for d in (Path(run_dir) / ATTEMPTS_DIR).iterdir() if d.name.isdigit()]
    except OSError:
        return None
    if not numbers:
        return None
    n = max(numbers)
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


def _read_failure_at(path: Path) -> dict | None:
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


def _stop_source(v: object) -> StopSource | None:
    return StopSource(v) if isinstance(v, str) and v in _STOP_SOURCES else None


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


def read_run_config(run_dir: Path | str) -> dict[str, Any]:
    """``run_config.json`` as a dict, or {} when absent or unreadable (informative, never a guard).

    Values are the job's: readers take numbers through ``finite_number``/``is_int``.
    """
    try:
        r = read_json_bounded(Path(run_dir) / RUN_CONFIG, limit=RUN_CONFIG_LIMIT)
    except (OSError, ValueError):
        return {}
    return r if isinstance(r, dict) else {}


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
# world_size: rank 0's heartbeat of a multi-rank job (issue 19): the other ranks write progress.rank-<r>.json.
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
    path = attempt_dir(run_dir, attempt) / PROGRESS_HISTORY
    try:
        f = open_regular(path)
    except OSError:
        return []
    if f is None:
        return []
    with f:
        st = os.fstat(f.fileno())
        f.seek(max(0, st.st_size - HISTORY_TAIL_BYTES))
        raw = f.read(HISTORY_TAIL_BYTES)
    lines = raw.split(b"\n")
    if st.st_size > HISTORY_TAIL_BYTES:
        lines = lines[1:]  # the first line of the tail is probably cut
    out = []
    for line in lines:
        try:
            rec = clean_progress(json.loads(line, parse_constant=float))
        except (ValueError, RecursionError):
            continue
        if rec:
            out.append(rec)
    return out


@dataclass(frozen=True)
class ExitRecord:
    """How the command of one attempt ended, as orch's job wrapper recorded it (``exit.json``).

    ``stop_signal``: the termination or warning signal the wrapper delivered to the program (or saw
    delivered to the whole job), None when the program ended on its own. An attempt that was asked
    to stop never gets an ``--outputs`` marker, whatever its exit code (issue 10: a program that
    exits 0 after SIGTERM is a preempted run, not a finished one).
    """

    token: str
    returncode: int | None
    signal: int | None = None
    ended_at: str = ""
    restart_count: int = 0
    time_limit_reached: bool = False
    stop_signal: str | None = None
    stop_source: StopSource | None = None  # an unknown word reads as None
    notice: str | None = None  # the spot notice behind a "spot_notice" stop, e.g. "aws: terminate at ..."
    marker_error: str | None = None
    error: str | None = None
    disk_full: bool = False  # the wrapper's own writes hit ENOSPC: the run dir's filesystem was full
    # Where the wrapper moved a done.json the program wrote itself and then exited non-zero or was stopped.
    marker_set_aside: str | None = None
    oom_kill: int | None = None  # OOM kills the attempt's memory cgroup counted (None: no cgroup; memlimit.py)
    # Where it ran (issue 19): ranks orch launched (None: the program's own business, e.g. its own torchrun) and
    # the nodes (Slurm's SLURM_JOB_NODELIST, e.g. "gpu[01-02]"; locally the hostname).
    world_size: int | None = None
    nodes: str | None = None
    # The rank whose program failed on its own first, and how (Popen's returncode: -9 is SIGKILL), when orch
    # launched the ranks (jobside/rankend.py): torchrun exits 1 for a rank's kill -9 too, which read as crash.
    failed_rank: int | None = None
    rank_returncode: int | None = None
    # When the program's own process ended, before the wrapper stopped what it left running (issue 41): a stop
    # record written after this came from a leftover, not from the program's end.
    program_ended_at: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


FENCE_LIMIT = 4096


def write_fence(attempt_path: Path, token: str, fence: int, batch: SyncBatch | None = None, *,
                group: GroupSlot | None = None) -> None:
    """Record which launch claim of the attempt is the current one (atomic: a wrapper reads the old
    record or the new one, never a torn one). ``batch``: in place only once the batch commits. ``group``:
    the group submission (a Slurm array) this claim's launch goes out in, and the attempt's index in it (for
    people and tools reading the run dir, ``read_group_slot``; orch finds a task's job from its batch's table)."""
    record: dict[str, Any] = {"token": token, "fence": fence, "at": now_iso()}
    if group is not None:
        record["group"], record["task"] = group.token, group.task
    if batch is not None:
        batch.write_json(attempt_path / FENCE_FILE, record)
    else:
        atomic_write_json(attempt_path / FENCE_FILE, record)


def claim_fence(attempt_path: Path, token: str, fence: int, group: GroupSlot) -> bool:
    """A wrapper whose launch left its records in the batch (``BATCH_RECORDS``): its own claim's fence record
    put in place only if the attempt dir has none yet. One a cancel (generation 0) or a re-claimer's launch
    wrote first is kept, and the wrapper's check then finds its launch stale; False when one was there."""
    record = {"token": token, "fence": fence, "at": now_iso(), "group": group.token, "task": group.task}
    return atomic_create(attempt_path / FENCE_FILE, json.dumps(record, sort_keys=True) + "\n")


@dataclass(frozen=True)
class GroupSlot:
    """A group submission's token (``b`` + hex, a name inside the runs root) and one attempt's index in it."""

    token: str
    task: int


_GROUP_TOKEN = re.compile(r"b[0-9a-f]{8,64}")


def is_group_token(value: object) -> bool:
    """Whether ``value`` is a group submission's token (it becomes a path component: ``../x`` must not)."""
    return isinstance(value, str) and _GROUP_TOKEN.fullmatch(value) is not None


def batch_file(runs_root: Path, token: str, name: str) -> Path:
    """``<runs root>/.orch-batches/<token>/<name>``, or UnsafePath when the token is not one or a component is a
    symlink: a symlinked batch dir (or a linked file) led orch's writes and hole punching outside the runs root
    (hostile test)."""
    if not is_group_token(token):
        raise UnsafePath(f"not a batch token: {token!r}")
    return resolve_inside(runs_root, f"{BATCHES_DIR}/{token}/{name}")


def make_batch_dir(runs_root: Path, token: str) -> Path:
    """The batch dir, made (0700) where missing, each component checked to be no symlink before anything is made
    under it; UnsafePath otherwise."""
    if not is_group_token(token):
        raise UnsafePath(f"not a batch token: {token!r}")
    os.makedirs(runs_root, exist_ok=True)
    d = runs_root
    for part in (BATCHES_DIR, token):
        d = d / part
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)
        if d.is_symlink() or not d.is_dir():
            raise UnsafePath(f"{d} is not a directory of orch's (a symlink or a file)")
    return d


def read_fence(attempt_path: Path) -> tuple[str, int] | None:
    """(token, fence) of the attempt dir's fence record; None if absent or malformed."""
    r = _fence_record(attempt_path)
    if r is None or not isinstance(r.get("token"), str) or not is_int(r.get("fence")):
        return None
    return r["token"], int(r["fence"])


def read_group_slot(attempt_path: Path) -> GroupSlot | None:
    """The group submission the attempt's current claim went out in, from its fence record; None for a single
    submission, or a record that does not name a well-formed one (the token becomes a path: a forged
    ``../x`` must lead nowhere)."""
    r = _fence_record(attempt_path)
    if r is None or not is_group_token(r.get("group")) \
            or not is_int(r.get("task")) or int(r["task"]) < 0:
        return None
    return GroupSlot(r["group"], int(r["task"]))


def _fence_record(attempt_path: Path) -> dict[str, Any] | None:
    try:
        r = read_json_bounded(attempt_path / FENCE_FILE, limit=FENCE_LIMIT)
    except (OSError, ValueError):
        return None
    return r if isinstance(r, dict) else None


def write_exit(attempt_path: Path, record: ExitRecord) -> None:
    atomic_write_json(attempt_path / EXIT_FILE, {**record.as_dict(), "time": time.time()})


def read_exit(attempt_path: Path, token: str | None = None) -> ExitRecord | None:
    """The wrapper's exit record if present, well formed and (when ``token`` is given) this attempt's.

    A record of another attempt (a run dir reused under a fresh DB) or of the wrong shape is None:
    every field is type- and range-checked, since the job itself can write this file.
    """
    return _read_exit_at(attempt_path / EXIT_FILE, token)


def _read_exit_at(path: Path, token: str | None) -> ExitRecord | None:
    try:
        r = read_json_bounded(path, limit=EXIT_LIMIT)
    except (OSError, ValueError):
        return None
    if not isinstance(r, dict) or not isinstance(r.get("token"), str):
        return None
    if token is not None and r["token"] != token:
        return None
    rc, sig = r.get("returncode"), r.get("signal")

    def text(k: str) -> str | None:
        v = r.get(k)
        return v[:500] if isinstance(v, str) else None

    return ExitRecord(
        token=r["token"],
        returncode=rc if is_int(rc, -255, 255) else None,
        signal=sig if is_int(sig, 1, 128) else None,
        ended_at=text("ended_at") or "",
        restart_count=r["restart_count"] if is_int(r.get("restart_count"), 0, 10**6) else 0,
        time_limit_reached=r.get("time_limit_reached") is True,
        stop_signal=text("stop_signal"),
        stop_source=_stop_source(r.get("stop_source")),
        notice=text("notice"),
        marker_error=text("marker_error"),
        error=text("error"),
        disk_full=r.get("disk_full") is True,
        marker_set_aside=text("marker_set_aside"),
        oom_kill=r["oom_kill"] if is_int(r.get("oom_kill"), 0, 10**9) else None,
        world_size=r["world_size"] if is_int(r.get("world_size"), 1, 10**7) else None,
        nodes=text("nodes"),
        **_rank_end(r),
        program_ended_at=text("program_ended_at") or "",
    )


# A rank's end as Popen's returncode: an exit code, or minus a signal number (jobside/rankend.py writes it).
RANK_RETURNCODE_MIN, RANK_RETURNCODE_MAX = -64, 255


def _rank_end(r: Mapping[str, Any]) -> dict[str, int]:
    """failed_rank and rank_returncode, both or neither: a rank's clean exit (0) is never an attempt's end."""
    rank, rc = r.get("failed_rank"), r.get("rank_returncode")
    if not is_int(rank, 0, 10**7) or not is_int(rc, RANK_RETURNCODE_MIN, RANK_RETURNCODE_MAX) or rc == 0:
        return {}
    return {"failed_rank": rank, "rank_returncode": rc}


# =========================================================================================
# the kit's completion record and stop record (the job writes both; orch's wrapper and classify read them)
# =========================================================================================
COMPLETE_LIMIT = 256 * 1024
STOP_LIMIT = 16 * 1024
MAX_OUTPUTS = 1000


@dataclass(frozen=True)
class CompletionRecord:
    """``attempts/<n>/complete.json``: the program's kit says training completed and what it produced.

    Written instead of done.json under orch's wrapper, which writes the marker only after the program
    exits 0 (issue 17: the callbacks' done.json verified a script that raised in its export right after).
    ``outputs``: run-dir-relative paths or globs; one ending in ``/`` is everything under that dir.
    """

    token: str
    step: int | None
    at: str
    outputs: tuple[str, ...]

    def patterns(self) -> list[str]:
        """The outputs as ``glob`` patterns (a dir ``x/`` becomes ``x/**``)."""
        return [o + "**" if o.endswith("/") else o for o in self.outputs]


def write_completion(run_dir: Path | str, attempt: int, token: str, step: int | None,
                     outputs: list[str]) -> Path:
    """Record that training completed: ``attempts/<n>/complete.json`` (atomic). ``result/`` is always listed."""
    outs = [f"{RESULT_DIR}/"] + [o for o in outputs if o != f"{RESULT_DIR}/"]
    d = attempt_dir(run_dir, attempt)
    d.mkdir(parents=True, exist_ok=True)
    path = d / COMPLETE_FILE
    atomic_write_json(path, {"token": token, "step": step, "at": now_iso(), "outputs": outs})
    return path


def _clean_output(o: Any) -> str | None:
    """A record's output path/glob if it stays inside the run dir (no ``/``-rooted, ``..``, NUL), else None."""
    if not isinstance(o, str) or len(o) > 500:
        return None
    try:
        safe_relpath(o[:-1] if o.endswith("/") else o)
    except UnsafePath:
        return None
    return o


def read_completion(attempt_path: Path, token: str) -> CompletionRecord | None:
    """This attempt's completion record (the token must match), validated; None when absent or bad.

    The job writes it: outputs that could leave the run dir are dropped, never followed.
    """
    try:
        r = read_json_bounded(attempt_path / COMPLETE_FILE, limit=COMPLETE_LIMIT)
    except (OSError, ValueError):
        return None
    if not isinstance(r, dict) or r.get("token") != token or not isinstance(r.get("outputs"), list):
        return None
    outs = tuple(o for o in (_clean_output(x) for x in r["outputs"][:MAX_OUTPUTS]) if o is not None)
    step = r.get("step")
    at = r.get("at")
    return CompletionRecord(token=token, step=step if is_int(step, 0, MAX_DB_INT) else None,
                            at=at[:64] if isinstance(at, str) else "", outputs=outs)


@dataclass(frozen=True)
class StopRecord:
    """``attempts/<n>/stop.json``: the program's kit received a stop signal (from orch, Slurm, a user's kill,
    a container stop, a VM shutdown) at ``at``; ``step``: the last completed step, filled at the next step
    boundary. An attempt with this record is never verified, whatever its exit code (issue 17: an HF
    script with enable_jit_checkpoint exited 0 after SIGTERM and was verified half-trained)."""

    signal: str
    at: str
    step: int | None = None


def write_stop(attempt_path: Path, signal_name: str, at: str, step: int | None, token: str | None) -> None:
    attempt_path.mkdir(parents=True, exist_ok=True)
    atomic_write_json(attempt_path / STOP_FILE, {"signal": signal_name, "at": at, "step": step, "token": token})


def read_stop(attempt_path: Path, token: str | None = None) -> StopRecord | None:
    """The attempt's stop record, validated (and of ``token`` when given); None when absent or bad.

    A stop.json that exists but does not parse is still a stop: the kit writes it atomically, so garbage
    there came from elsewhere, and "stopped" is the safe reading (never verified, retried).
    """
    path = attempt_path / STOP_FILE
    try:
        r = read_json_bounded(path, limit=STOP_LIMIT)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return StopRecord(signal="unknown", at="", step=None) if (path.exists() or path.is_symlink()) else None
    if not isinstance(r, dict):
        return StopRecord(signal="unknown", at="", step=None)
    if token is not None and isinstance(r.get("token"), str) and r["token"] != token:
        return None  # another attempt's (a run dir reused under a fresh DB)
    sig, at, step = r.get("signal"), r.get("at"), r.get("step")
    return StopRecord(signal=sig[:32] if isinstance(sig, str) and sig.isprintable() else "unknown",
                      at=at[:64] if isinstance(at, str) else "",
                      step=step if is_int(step, 0, MAX_DB_INT) else None)


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
    the program sees only a stop signal, which a node failure and a preemption both send (issue 18: a NODE_FAIL
    rerun in place was shown and counted as a preemption). Where the scheduler gave no cause, the records decide.
    """
    d = attempt_dir(run_dir, attempt)
    scheduler = read_restart_causes(d, token)
    out: list[dict[str, Any]] = []
    for k in range(1, MAX_RESTARTS_SHOWN + 1):
        said = scheduler[k - 1] if k <= len(scheduler) else None
        failure = _read_failure_at(d / aside_name(FAILURE_FILE, k))
        ended = _read_exit_at(d / aside_name(EXIT_FILE, k), token)
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
    ``orch show``, the metrics and goodput (issue 18: a NODE_FAIL rerun was counted as a preemption)."""
    return sum(1 for h in history[:restarts] if h["class"] == FailureClass.PREEMPTED.value) + \
        max(0, restarts - len(history))


@dataclass
class RunDirReport:
    """What ``orch show`` says about a run dir beyond the DB: files orch will not touch, bad records."""

    foreign_checkpoint_files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def inspect_run_dir(run_dir: Path | str, attempt: int | None) -> RunDirReport:
    """Name the user's own files under checkpoints/ (left in place by requeue) and job-written
    records of ``attempt`` that orch refused to read. Reads only directory entries and small files."""
    rep = RunDirReport()
    root = Path(run_dir) / CHECKPOINTS_DIR
    try:
        if root.is_dir() and not root.is_symlink():
            rep.foreign_checkpoint_files = sorted(p.name for p in root.iterdir()
                                                  if not OWN_CHECKPOINT_RE.match(p.name))[:50]
    except OSError as e:
        rep.problems.append(f"{CHECKPOINTS_DIR}/ unreadable: {e.strerror or e}")
    if attempt is None:
        return rep
    adir = attempt_dir(run_dir, attempt)
    for name, limit in ((EXIT_FILE, EXIT_LIMIT), (FAILURE_FILE, FAILURE_LIMIT), (PROGRESS_FILE, PROGRESS_LIMIT)):
        try:
            read_json_bounded(adir / name, limit=limit)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            rep.problems.append(f"{ATTEMPTS_DIR}/{attempt}/{name}: {e}")
    return rep
