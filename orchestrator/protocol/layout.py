"""Run-dir names, the environment a job gets, failure classes, exit codes, safe names and paths.

Every run-dir file name is spelled here and nowhere else in the code base (stdlib only).
"""

from __future__ import annotations

import enum
import errno
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SCHEMA = 1

# --- run-dir layout (contract) -------------------------------------------------------------
DONE_MARKER = "done.json"
RUN_CONFIG = "run_config.json"
ATTEMPTS_DIR = "attempts"
CHECKPOINTS_DIR = "checkpoints"
RESULT_DIR = "result"
COMMAND_FILE = "command.json"  # written by orch before the launch: argv, overrides, token (never by the job)
PROGRAM_FILE = "program.json"  # written by the program at its start (the bundled trainer): argv, host, pid
FAILURE_FILE = "failure.json"
RANK_FAILURE = "failure.rank-{:05d}.json"  # a multi-rank job's rank r > 0 that failed by itself, beside failure.json
PROGRESS_FILE = "progress.json"
PROGRESS_HISTORY = "progress.jsonl"  # every heartbeat, appended: the loss curve across a whole attempt
# A multi-rank job's rank r > 0: its own small heartbeat beside rank 0's progress.json (a hung rank 1
# was invisible while rank 0 alone wrote, and the hang detector could only judge rank 0).
RANK_PROGRESS = "progress.rank-{:05d}.json"
RANK_PROGRESS_RE = re.compile(r"^progress\.rank-(\d{5})\.json$")
# A rank of a multi-rank job whose program uses orch's kit says so as it starts, before its process group forms
# (rank 1 stopped before it, rank 0 waited in init_process_group, no rank ever beat, and the hang
# detector, which judges only jobs that beat, never armed): {"rank", "world_size", "since" (its first arming),
# "time"}, rewritten until the rank first beats (protocol.write_rank_armed).
RANK_ARMED = "armed.rank-{:05d}.json"
RANK_ARMED_RE = re.compile(r"^armed\.rank-(\d{5})\.json$")
# The wrapper's own sight of its program: exists while the program is stopped (SIGSTOP, Ctrl-Z), written when it
# first saw it so (stoppedwatch.py; staleness judges its mtime: a program stopped hang_timeout_s is hung).
PROGRAM_STOPPED = "program-stopped.json"
EXIT_FILE = "exit.json"  # written by orch's job wrapper when the command exits
COMPLETE_FILE = "complete.json"  # the kit's completion record under orch's wrapper: training completed, what it made
STOP_FILE = "stop.json"  # the kit's record of a stop signal the program received (whoever sent it)
REJECTED_MARKER_PREFIX = "done.rejected-"  # done.rejected-<k>.json: a program's own done.json the wrapper refused
EXIT_RESERVE = "exit.reserve"  # the wrapper's ballast: freed to make room for exit.json on a full disk
WRAPPER_FILE = "wrapper.json"  # written by orch's job wrapper when the command starts (informative only)
# Written by orch (atomically) after it won an attempt's launch claim and before the backend call: the
# claim's fencing generation. A wrapper started with another generation does not run the program.
FENCE_FILE = "fence.json"
SUPERSEDED_FILE = "superseded.json"  # written by a wrapper that found its fence stale (it ran nothing)
# Written by orch (the controller) from the scheduler's account: why each earlier run of an attempt restarted in
# place ended (Slurm's per-run sacct State). It wins over the class the program guessed from a stop signal.
RESTART_CAUSES_FILE = "restart_causes.json"
# Written by the wrapper: each time it restarted a multi-rank program's ranks inside the job's own allocation
# (``--rank-restarts``), why and from which step. The failed launch's own reports (failure.json, its ranks'
# failure.rank-<r>.json, stop.json) move to ``rank-restarts/<k>/``: left in place, the next launch's survivors read
# a peer's old crash as their own cause, and ``*.prev-<k>`` names belong to the scheduler's in-place reruns.
RANK_RESTARTS_FILE = "rank_restarts.json"
RANK_RESTARTS_DIR = "rank-restarts"
WRAPPER_LOG = "wrapper.log"  # the wrapper's own stdout/stderr (local backend)
STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"
SLURM_DIR = "slurm"  # attempts/<n>/slurm/: batch script, sbatch's record, Slurm's output file
SLURM_SCRIPT = "job.sbatch"
SLURM_SUBMITTED = "submitted.json"
SLURM_OUTPUT_PATTERN = "slurm-%j.out"
BATCHES_DIR = ".orch-batches"  # <runs root>/.orch-batches/<token>/: a group submission's files
# <runs root>/.orch-locks/<job>.trackers.lock: held by the child that marks a job's tracker run with its end and by
# the wrapper arranging the next attempt's run, so the two never interleave (a requeue a second after `orch cancel`
# had its new attempt's MLflow run marked KILLED). Beside the run dir, not in it: a holder with a file open in the
# run dir reads as a process of an old attempt still running there, and `orch requeue` refused.
LOCKS_DIR = ".orch-locks"
TRACKERS_LOCK_SUFFIX = ".trackers.lock"
# A group launch's attempt records for tasks whose run dir it made: each task's wrapper puts its own
# command.json and fence.json in place from these when it starts, and takes its ballast from the batch's pool.
BATCH_RECORDS = "records.json"
BATCH_RESERVE = "exit.reserve"  # the batch's ballast pool: slot i (ballast.SLOT_BYTES) is task i's until it starts
MANIFEST = "manifest.json"


FAULTS_FIRED = ".faults_fired.json"  # injected faults that already fired (fire at most once per run dir)
TENSORBOARD_DIR = "tensorboard"  # one stable TensorBoard log dir for every attempt
TRACKERS_FILE = "trackers.json"  # the job's one tracker run that every attempt continues (mlflowrun.py)
CHECKPOINT_RE = re.compile(r"^step-(\d{8})$")
# Names under checkpoints/ that orch's own writers create (committed, being written, set aside):
# the only ones requeue may move. Anything else there is the user's (a script's own
# checkpoints/ckpt.pt was trashed and the run restarted from step 0).
OWN_CHECKPOINT_RE = re.compile(r"^step-\d{8}(?:$|\.tmp-|\.(?:corrupt|abandoned)-)")

# What orch (its wrapper, its kit, the bundled trainer) writes in a run dir: never a result. An --outputs
# glob matching any of it (`**` listed attempts/1/exit.reserve) made every attempt end marker_corrupt.
ORCH_OWNED_TOP_DIRS = (ATTEMPTS_DIR, CHECKPOINTS_DIR, TENSORBOARD_DIR)
ORCH_OWNED_TOP_FILES = (DONE_MARKER, RUN_CONFIG, FAULTS_FIRED, TRACKERS_FILE)
# One representative path of each kind, for testing a glob with glob's own semantics.
ORCH_OWNED_SAMPLES = (DONE_MARKER, RUN_CONFIG, FAULTS_FIRED, TRACKERS_FILE, f"{ATTEMPTS_DIR}/1/{EXIT_FILE}",
                      f"{ATTEMPTS_DIR}/1/{EXIT_RESERVE}", f"{ATTEMPTS_DIR}/1/{COMMAND_FILE}",
                      f"{CHECKPOINTS_DIR}/step-00000001/{MANIFEST}", f"{TENSORBOARD_DIR}/x")


def is_orch_owned(rel: str) -> bool:
    """Whether the run-dir-relative path ``rel`` names something orch owns (see ORCH_OWNED_SAMPLES), or a
    temporary of one of its atomic writes (``.done.json.tmp-...``)."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts:
        return True  # the run dir itself
    if parts[0] in ORCH_OWNED_TOP_DIRS or (len(parts) == 1 and parts[0] in ORCH_OWNED_TOP_FILES):
        return True
    return len(parts) == 1 and any(parts[0].startswith(f".{f}") for f in ORCH_OWNED_TOP_FILES)

# --- environment a job command receives (contract) -----------------------------------------
ENV_RUN_DIR = "ORCH_RUN_DIR"
ENV_JOB_NAME = "ORCH_JOB_NAME"
ENV_ATTEMPT = "ORCH_ATTEMPT"
ENV_OVERRIDES = "ORCH_OVERRIDES"
ENV_TOKEN = "ORCH_SUBMIT_TOKEN"
ENV_RUN_ID = "ORCH_RUN_ID"  # stable across attempts: one tracker curve per run dir
ENV_TENSORBOARD_DIR = "ORCH_TENSORBOARD_DIR"
# The step an attempt resumes from (0: a fresh start): what a tracker of the program should show from the next
# step on is this attempt's (TensorBoard's purge_step is this + 1). The wrapper sets it from the
# committed checkpoints; the kit corrects it in-process once it verified the one it restored.
ENV_RESUME_STEP = "ORCH_RESUME_STEP"
# Set by orch's job wrapper: it writes done.json after the program exits 0 (a callback's
# done.json, written before the script's own export raised, verified a run that exited 1); the kit
# then writes attempts/<n>/complete.json instead. Unset (a script run by hand), the kit writes done.json.
ENV_MARKER_WRITER = "ORCH_MARKER_WRITER"
MARKER_WRITER_WRAPPER = "wrapper"
ENV_SWEEP = "ORCH_SWEEP"  # a sweep task's sweep name
ENV_TASK_INDEX = "ORCH_TASK_INDEX"  # ... its index in the sweep
ENV_SWEEP_PARAMS = "ORCH_SWEEP_PARAMS"  # ... and its argument set, as a JSON object


# --- failure classes (contract, exact strings) ---------------------------------------------
class FailureClass(enum.StrEnum):
    """Why an attempt ended without a verified marker. The job writes it (failure.json), or
    ``orchestrator.decide.classify`` infers it; ``policy`` decides what happens next from it."""

    PREEMPTED = "preempted"
    TIMEOUT = "timeout"
    OOM = "oom"
    NAN = "nan"
    ENOSPC = "enospc"
    HANG = "hang"
    NODE_FAIL = "node_fail"
    CRASH = "crash"
    INVALID = "invalid"
    MARKER_MISSING = "marker_missing"
    MARKER_CORRUPT = "marker_corrupt"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"
    # Added 2026-12: an input missing at start (maybe an NFS hiccup: retried, and invalid
    # only when it repeats); the job's own failures without checkpoint progress over N attempts; a
    # SIGKILL with no record of the program's own (kill -9, an OOM killer that could not be told apart).
    INPUT_MISSING = "input_missing"
    NO_PROGRESS = "no_progress"
    KILLED = "killed"
    # A transient storage fault (EIO, ESTALE, EAGAIN, ETIMEDOUT) on a checkpoint or run-dir write; one
    # EIO with the previous checkpoint intact was a counted crash (`failed` under --max-attempts 1).
    STORAGE = "storage"

    # What the policy does with a class, on two axes (as Ray's exit types): whose failure it was (``fault``),
    # and the retry defaults orch.toml's [policy] may change (``auto_requeue``, ``counted``, ``cap``).
    @property
    def fault(self) -> Fault:
        return _TRAITS[self][0]

    @property
    def auto_requeue(self) -> bool:
        """The reconciler requeues it by itself (default of ``policy.auto_requeue``)."""
        return _TRAITS[self][1].auto

    @property
    def counted(self) -> bool:
        """It counts against --max-attempts (default; ``policy.uncounted`` lists the others)."""
        return _TRAITS[self][1].counted

    @property
    def cap(self) -> int | None:
        """At most this many attempts end with it (default of ``policy.caps``); None: no cap."""
        return _TRAITS[self][1].cap


class Fault(enum.StrEnum):
    """Whose failure a class is: the first axis of the policy."""

    PLATFORM = "platform"  # the capacity went away (preemption, a node): never counted, whatever orch.toml says
    RUN = "run"  # the program's own run failed (time, memory, code, liveness): the no-progress guard counts these
    OTHER = "other"  # data, outputs, input, orch's own reasons: the policy handles each by its class


@dataclass(frozen=True)
class Retry:
    """The second axis: what a retry of the class gets by default."""

    auto: bool  # the reconciler requeues by itself
    counted: bool  # counts against --max-attempts
    cap: int | None = None  # at most this many attempts of the class (uncounted ones too: a loop is a bug)


_C, _F = FailureClass, Fault
_TRAITS: dict[FailureClass, tuple[Fault, Retry]] = {
    _C.PREEMPTED: (_F.PLATFORM, Retry(auto=True, counted=False, cap=100)),
    _C.NODE_FAIL: (_F.PLATFORM, Retry(auto=True, counted=False, cap=20)),
    _C.STORAGE: (_F.PLATFORM, Retry(auto=True, counted=False, cap=10)),  # backed off; the storage is not the job
    _C.TIMEOUT: (_F.RUN, Retry(auto=True, counted=False, cap=50)),
    _C.OOM: (_F.RUN, Retry(auto=True, counted=True, cap=3)),
    _C.HANG: (_F.RUN, Retry(auto=True, counted=True, cap=3)),
    _C.KILLED: (_F.RUN, Retry(auto=True, counted=True, cap=3)),  # Auto, backed off like crash
    _C.CRASH: (_F.RUN, Retry(auto=False, counted=True, cap=3)),
    _C.NAN: (_F.OTHER, Retry(auto=True, counted=True, cap=3)),
    _C.ENOSPC: (_F.OTHER, Retry(auto=True, counted=True, cap=2)),
    # Bounded by policy.input_missing_attempts instead (an NFS hiccup is not the job's fault).
    _C.INPUT_MISSING: (_F.OTHER, Retry(auto=True, counted=False)),
    _C.INVALID: (_F.OTHER, Retry(auto=False, counted=True)),
    _C.MARKER_MISSING: (_F.OTHER, Retry(auto=False, counted=True)),
    _C.MARKER_CORRUPT: (_F.OTHER, Retry(auto=False, counted=True)),
    _C.CANCELLED: (_F.OTHER, Retry(auto=False, counted=True)),  # the policy decides it apart: never counted
    _C.UNKNOWN: (_F.OTHER, Retry(auto=False, counted=True)),
    _C.NO_PROGRESS: (_F.OTHER, Retry(auto=False, counted=True)),
}

FAILURE_CLASSES = tuple(c.value for c in FailureClass)
# The errors of storage that may pass: the class ``storage`` (never the job's own failure). A full disk or a quota
# is ``enospc``; any other error of a write stays the program's (``crash``).
TRANSIENT_STORAGE_ERRNOS = frozenset({errno.EIO, errno.ESTALE, errno.EAGAIN, errno.ETIMEDOUT})
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})  # EFBIG: a file-size limit of the storage


def storage_errno(e: BaseException | None) -> int | None:
    """The errno of a full disk or of a storage fault that may pass in ``e`` or its ``__cause__`` chain (a framework
    re-raises its own error ``from`` the OSError; a few links deep), else None. Never ``__context__``: an error raised
    while one was being handled is that code's own."""
    for _ in range(8):
        if e is None:
            break
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS | TRANSIENT_STORAGE_ERRNOS:
            return e.errno
        e = e.__cause__
    return None


def write_error_class(e: BaseException | None) -> str:
    """The class of a failed write (a checkpoint, the result, a launch's records): ``enospc`` (free space, a quota),
    ``storage`` (EIO, ESTALE, EAGAIN, ETIMEDOUT: a fault of the storage that may pass, never the job's own), else
    ``crash`` (``storage_errno``)."""
    code = storage_errno(e)
    if code is None:
        return "crash"
    return "enospc" if code in DISK_FULL_ERRNOS else "storage"


class StopSource(enum.StrEnum):
    """Who stopped the program, as the job wrapper records it (``exit.json``'s ``stop_source``)."""

    TIME_LIMIT = "time_limit"  # the wrapper's own --time limit ran out
    WARNING = "warning"  # the scheduler's early warning before its time limit (Slurm --signal)
    SIGNAL = "signal"  # a SIGTERM/SIGINT reached the wrapper: preemption, scancel, a user
    SPOT_NOTICE = "spot_notice"  # a cloud's spot interruption notice


TIME_LIMIT_SOURCES = frozenset({StopSource.TIME_LIMIT, StopSource.WARNING})  # a stop of these is a timeout

# Exit codes of the bundled trainer (documented in docs/guides/bundled-trainer.md). A job that wrote failure.json is
# classified from it; the code is only a fallback for readers that cannot see the run dir.
EXIT_OK = 0
EXIT_USAGE = 2  # argparse: argument-only checks failed, nothing written
EXIT_FAILURE_REPORTED = 3  # see attempts/<n>/failure.json
EXIT_PREEMPTED = 143  # 128 + SIGTERM: checkpoint saved, failure.json says preempted

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


# =========================================================================================
# names and paths
# =========================================================================================
class UnsafePath(ValueError):
    """A name or path that would leave the run dir or the runs root."""


def validate_job_name(name: str) -> str:
    """Return ``name`` if it is safe as a directory name and an sbatch value, else raise.

    Letters, digits, ``.``, ``_``, ``-``; starts with a letter or digit; at most 128 chars; not
    ``.``/``..``. A name with ``/`` or ``..`` would put a run dir outside the runs root; a newline
    would smuggle an ``#SBATCH`` line into a batch script.
    """
    # fullmatch, not match: "$" also matches before a trailing newline, so "abc\n" used to pass
    # and became a run dir (and an sbatch value) with a newline in it.
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:
        raise UnsafePath(
            f"invalid job name {name!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, and no '..'"
        )
    return name


def safe_relpath(rel: str) -> str:
    """Normalise an artifact path relative to a run dir, refusing anything that could escape it."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        raise UnsafePath(f"invalid artifact path {rel!r}")
    if rel.startswith("/") or any(part in ("", ".", "..") for part in rel.split("/")):
        raise UnsafePath(f"artifact path {rel!r} leaves the run dir or is not normalised")
    return rel


def resolve_inside(root: Path, rel: str) -> Path:
    """``root/rel`` if every component below ``root`` is a real (non-symlink) entry inside it."""
    rel = safe_relpath(rel)
    p = root
    for part in rel.split("/"):
        p = p / part
        if p.is_symlink():
            raise UnsafePath(f"{rel!r} goes through a symlink ({p.name})")
    return p


def rank_failures(attempt_path: Path) -> list[Path]:
    """The attempt's ``failure.rank-<r>.json`` files (RANK_FAILURE), sorted by rank."""
    return sorted(attempt_path.glob(RANK_FAILURE.replace("{:05d}", "*")))


def attempt_dir(run_dir: Path | str, attempt: int) -> Path:
    # one Path parsed, not three: `orch report` over 1,000 live jobs spent ~60 ms building these
    return Path(os.path.join(run_dir, ATTEMPTS_DIR, str(int(attempt))))


def newest_attempt(run_dir: Path | str) -> int | None:
    """The highest n of the run dir's ``attempts/<n>/`` (made by the launcher before the backend call); None when
    there is none, or ``attempts/`` cannot be read."""
    try:
        numbers = [int(d.name) for d in (Path(run_dir) / ATTEMPTS_DIR).iterdir()
                   if d.name.isascii() and d.name.isdigit()]
    except OSError:
        return None
    return max(numbers, default=None)


def checkpoint_name(step: int) -> str:
    return f"step-{int(step):08d}"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")




def stable_run_id(run_dir: Path | str, job: str) -> str:
    """One id per run dir for experiment trackers, so every attempt continues one curve."""
    return f"{job}-{hashlib.sha256(str(run_dir).encode()).hexdigest()[:8]}"


def job_env(run_dir: Path | str, job: str, attempt: int, overrides: Mapping[str, Any] | None = None,
            token: str | None = None) -> dict[str, str]:
    """Environment variables a job command receives (contract)."""
    run_dir = str(run_dir)
    env = {ENV_RUN_DIR: run_dir, ENV_JOB_NAME: job, ENV_ATTEMPT: str(int(attempt)),
           ENV_OVERRIDES: json.dumps(dict(overrides or {}), sort_keys=True),
           ENV_RUN_ID: stable_run_id(run_dir, job),
           ENV_TENSORBOARD_DIR: str(Path(run_dir) / TENSORBOARD_DIR)}
    if token:
        env[ENV_TOKEN] = token
    return env


WANDB_TAG_LIMIT = 64


def tracker_env(environ: Mapping[str, str], run_dir: Path | str, job: str) -> dict[str, str]:
    """Tracker variables to add unless the user set their own: W&B resumes the run dir's one run, named after the
    job, grouped by its sweep, tagged with both (``orch.job:<job>``, ``orch.sweep:<sweep>``, ``orch.task:<i>``)."""
    out = {}
    if "WANDB_RUN_ID" not in environ:
        out["WANDB_RUN_ID"] = stable_run_id(str(run_dir), job)
    if "WANDB_RESUME" not in environ:
        out["WANDB_RESUME"] = "allow"
    if "WANDB_NAME" not in environ:
        out["WANDB_NAME"] = job
    sweep = environ.get(ENV_SWEEP, "")
    if sweep and "WANDB_RUN_GROUP" not in environ:
        out["WANDB_RUN_GROUP"] = sweep
    if "WANDB_TAGS" not in environ:
        tags = [f"orch.job:{job}"] + ([f"orch.sweep:{sweep}", f"orch.task:{environ.get(ENV_TASK_INDEX, '')}"]
                                      if sweep else [])
        # W&B refuses a tag over 64 characters in wandb.init, which then raises in the user's program
        fitting = ",".join(t for t in tags if len(t) <= WANDB_TAG_LIMIT and "," not in t)
        if fitting:
            out["WANDB_TAGS"] = fitting
    return out
