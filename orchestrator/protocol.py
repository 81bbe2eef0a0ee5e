"""The run-directory protocol: the one thing the trainer and the orchestrator share (stdlib only).

The commit rule: a marker (``done.json``, a checkpoint's ``manifest.json``) exists under its final
name only after every file it lists was fsynced, the marker itself was written to a same-directory
temporary file, fsynced, renamed into place with ``os.replace``, and the directory fsynced.
*Verified* means the marker parses and every listed file exists, is a regular file inside the run
dir (no symlinks, no ``..``), and has the listed size and sha256.

``verify_done_marker`` is THE completion predicate. The trainer's "already complete" guard,
``orch submit``'s refusal, ``orch requeue`` and ``orch reconcile`` all call it; nothing else in the
code base may decide that a run is finished (seed 000: a "directory is non-empty" guard and a
"result.json exists" requeue disagreed exactly on the state a failure leaves behind).

Importable by any training script (no torch, no database, no orchestrator imports).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import os
import re
import secrets
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

SCHEMA = 1

# --- run-dir layout (contract) -------------------------------------------------------------
DONE_MARKER = "done.json"
RUN_CONFIG = "run_config.json"
ATTEMPTS_DIR = "attempts"
CHECKPOINTS_DIR = "checkpoints"
RESULT_DIR = "result"
COMMAND_FILE = "command.json"
FAILURE_FILE = "failure.json"
PROGRESS_FILE = "progress.json"
EXIT_FILE = "exit.json"  # written by orch's job wrapper when the command exits
MANIFEST = "manifest.json"
FAULTS_FIRED = ".faults_fired.json"  # injected faults that already fired (fire at most once per run dir)
TMP_INFIX = ".tmp-"  # anything being written carries this in its name: never a committed object
CHECKPOINT_RE = re.compile(r"^step-(\d{8})$")

# --- environment a job command receives (contract) -----------------------------------------
ENV_RUN_DIR = "ORCH_RUN_DIR"
ENV_JOB_NAME = "ORCH_JOB_NAME"
ENV_ATTEMPT = "ORCH_ATTEMPT"
ENV_OVERRIDES = "ORCH_OVERRIDES"
ENV_TOKEN = "ORCH_SUBMIT_TOKEN"
ENV_RUN_ID = "ORCH_RUN_ID"  # one id per run dir: trackers (W&B, MLflow) continue one run across attempts
ENV_TENSORBOARD_DIR = "ORCH_TENSORBOARD_DIR"  # <run_dir>/tensorboard: one log dir across attempts
TENSORBOARD_DIR = "tensorboard"

# --- failure classes (contract, exact strings) ---------------------------------------------
FAILURE_CLASSES = (
    "preempted", "timeout", "oom", "nan", "enospc", "hang", "node_fail", "crash", "invalid",
    "marker_missing", "marker_corrupt", "cancelled", "unknown",
)

# Exit codes of the bundled trainer (documented in the README). A job that wrote failure.json is
# classified from it; the code is only a fallback for readers that cannot see the run dir.
EXIT_OK = 0
EXIT_USAGE = 2  # argparse: argument-only checks failed, nothing written
EXIT_FAILURE_REPORTED = 3  # see attempts/<n>/failure.json
EXIT_PREEMPTED = 143  # 128 + SIGTERM: checkpoint saved, failure.json says preempted

MAX_JSON_BYTES = 4 * 1024 * 1024  # hostile or runaway reports are refused, not parsed
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


def attempt_dir(run_dir: Path | str, attempt: int) -> Path:
    return Path(run_dir) / ATTEMPTS_DIR / str(int(attempt))


def checkpoint_name(step: int) -> str:
    return f"step-{int(step):08d}"


def tmp_name(final_name: str) -> str:
    """A same-directory name for something being written; never matches a committed name."""
    return f"{final_name}{TMP_INFIX}{secrets.token_hex(4)}"


# =========================================================================================
# durable writes
# =========================================================================================
def fsync_dir(path: Path | str) -> None:
    """Persist a directory entry (a rename or create inside ``path``)."""
    fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HashingWriter:
    """File-like wrapper that hashes bytes as they are written (one pass, no re-read)."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._h = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = self._f.write(data)
        self._h.update(data)
        self.size += len(data)
        return n if n is not None else len(data)

    def flush(self) -> None:
        self._f.flush()

    @property
    def sha256(self) -> str:
        return self._h.hexdigest()


def write_file_synced(path: Path, chunks: Iterable[bytes]) -> dict[str, Any]:
    """Write ``chunks`` to ``path`` (a new file), fsync it, and return ``{"size", "sha256"}``.

    The caller owns naming: write under a tmp name (or inside a tmp dir) and rename afterwards.
    On any error the partial file is removed and the error re-raised; a failed fsync is never
    retried (after an fsync error the kernel may already have marked the pages clean).
    """
    try:
        with open(path, "xb") as f:
            w = HashingWriter(f)
            for chunk in chunks:
                w.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        return {"size": w.size, "sha256": w.sha256}
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def atomic_write(path: Path | str, data: bytes | str) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    Same-directory tmp file, write, flush, fsync, ``os.replace``, fsync the directory. A reader
    sees the old content or the new, never a prefix. The tmp file is removed on failure.
    """
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    tmp = path.with_name(tmp_name(path.name))
    write_file_synced(tmp, [data])
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_json(path: Path | str, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def sha256_file(path: Path, bufsize: int = 1 << 20) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def read_json_bounded(path: Path, limit: int = MAX_JSON_BYTES) -> Any:
    """Parse a JSON file written by a job; refuse (ValueError) anything huge or not JSON."""
    with open(path, "rb") as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise ValueError(f"{path.name} is larger than {limit} bytes")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path.name} is not valid JSON: {str(e)[:80]}") from None


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


# =========================================================================================
# manifests: shared by done.json and checkpoints
# =========================================================================================
def _verify_listing(root: Path, listing: Any, *, hashes: bool = True) -> str | None:
    """None if every entry of ``{relpath: {size, sha256}}`` matches a real file under root."""
    if not isinstance(listing, dict) or not listing:
        return "lists no files"
    for rel, meta in listing.items():
        try:
            p = resolve_inside(root, rel)
        except UnsafePath as e:
            return str(e)
        if (
            not isinstance(meta, dict)
            or not isinstance(meta.get("size"), int)
            or isinstance(meta.get("size"), bool)
            or not isinstance(meta.get("sha256"), str)
        ):
            return f"entry for {rel!r} is not {{size: int, sha256: str}}"
        if not p.is_file():
            return f"{rel} is missing"
        st = p.stat()
        if st.st_size != meta["size"]:
            return f"{rel} has size {st.st_size}, marker says {meta['size']}"
        if hashes:
            _, digest = sha256_file(p)
            if digest != meta["sha256"]:
                return f"{rel} sha256 mismatch"
    return None


# =========================================================================================
# the terminal marker: THE completion predicate
# =========================================================================================
class MarkerStatus(str, enum.Enum):
    VERIFIED = "VERIFIED"
    ABSENT = "ABSENT"
    CORRUPT = "CORRUPT"


@dataclass(frozen=True)
class Verification:
    status: MarkerStatus
    reason: str = ""
    marker: dict | None = None

    @property
    def verified(self) -> bool:
        return self.status is MarkerStatus.VERIFIED

    def __str__(self) -> str:
        # One short line whatever the marker holds: reasons quote marker content (paths, sizes), and a
        # listed path "x\nVERIFIED" must not print a second line a script could mistake for the verdict.
        reason = self.reason if self.reason.isprintable() else self.reason.encode("unicode_escape").decode()
        reason = reason if len(reason) <= 300 else reason[:300] + "..."
        return self.status.value + (f": {reason}" if reason else "")


def verify_done_marker(run_dir: Path | str) -> Verification:
    """The one completion predicate: is ``run_dir/done.json`` present, well formed, and true?

    Reads every listed artifact and checks size and sha256, so "done" never rests on a file merely
    existing (an interrupted write leaves a file that exists). Never raises for bad content.
    """
    run_dir = Path(run_dir)
    marker_path = run_dir / DONE_MARKER
    if run_dir.is_symlink():
        return Verification(MarkerStatus.CORRUPT, "run dir is a symlink")
    if marker_path.is_symlink():
        return Verification(MarkerStatus.CORRUPT, f"{DONE_MARKER} is a symlink")
    if not marker_path.exists():
        return Verification(MarkerStatus.ABSENT, f"no {DONE_MARKER}")
    try:
        m = read_json_bounded(marker_path)
    except (OSError, ValueError) as e:
        return Verification(MarkerStatus.CORRUPT, str(e))
    if not isinstance(m, dict):
        return Verification(MarkerStatus.CORRUPT, f"{DONE_MARKER} is not a JSON object")
    if m.get("schema") != SCHEMA:
        return Verification(MarkerStatus.CORRUPT, f"unknown schema {m.get('schema')!r}")
    if not isinstance(m.get("job"), str) or not isinstance(m.get("attempt"), int):
        return Verification(MarkerStatus.CORRUPT, "job/attempt missing or of the wrong type")
    try:
        problem = _verify_listing(run_dir, m.get("artifacts"))
    except OSError as e:  # an unreadable artifact is not a finished result
        problem = f"cannot read an artifact: {e.strerror or e}"
    if problem:
        return Verification(MarkerStatus.CORRUPT, "artifacts " + problem if problem == "lists no files" else problem)
    return Verification(MarkerStatus.VERIFIED, "", m)


def write_done_marker(run_dir: Path | str, job: str, attempt: int, artifacts: Iterable[str]) -> dict:
    """Write ``done.json`` listing ``artifacts`` (paths relative to ``run_dir``); the LAST step of a run.

    Each artifact is fsynced before the marker is written, so a marker never lists bytes that are
    still only in the page cache. Raises UnsafePath for an artifact outside the run dir or a
    symlink, FileNotFoundError for a missing one. Callers: the trainer (rank 0) and orch's job
    wrapper for ``--outputs`` jobs; afterwards ``verify_done_marker`` answers VERIFIED.
    """
    run_dir = Path(run_dir)
    listing: dict[str, dict[str, Any]] = {}
    dirs: set[Path] = set()
    for rel in sorted(set(artifacts)):
        p = resolve_inside(run_dir, rel)
        if not p.is_file():
            raise FileNotFoundError(f"artifact {rel} is missing or not a regular file")
        with open(p, "rb") as f:
            os.fsync(f.fileno())
        size, digest = sha256_file(p)
        listing[safe_relpath(rel)] = {"size": size, "sha256": digest}
        dirs.add(p.parent)
    if not listing:
        raise ValueError("a done marker needs at least one artifact")
    for d in dirs:
        fsync_dir(d)
    marker = {
        "schema": SCHEMA,
        "job": job,
        "attempt": int(attempt),
        "finished_at": now_iso(),
        "artifacts": listing,
    }
    atomic_write_json(run_dir / DONE_MARKER, marker)
    return marker


# =========================================================================================
# checkpoints: committed = name step-<8 digits> + a manifest that verifies
# =========================================================================================
def checkpoint_step(path: Path) -> int | None:
    m = CHECKPOINT_RE.match(path.name)
    return int(m.group(1)) if m else None


def verify_checkpoint(ckpt_dir: Path, *, hashes: bool = True) -> str | None:
    """None if ``ckpt_dir`` is a committed checkpoint whose manifest verifies, else the reason."""
    step = checkpoint_step(ckpt_dir)
    if step is None:
        return f"{ckpt_dir.name} is not a committed checkpoint name"
    if ckpt_dir.is_symlink() or not ckpt_dir.is_dir():
        return f"{ckpt_dir.name} is not a directory"
    try:
        m = read_json_bounded(ckpt_dir / MANIFEST)
    except FileNotFoundError:
        return f"{ckpt_dir.name} has no {MANIFEST}"
    except (OSError, ValueError) as e:
        return f"{ckpt_dir.name}: {e}"
    if not isinstance(m, dict) or m.get("step") != step:
        return f"{ckpt_dir.name}: manifest step {m.get('step') if isinstance(m, dict) else None!r} != {step}"
    problem = _verify_listing(ckpt_dir, m.get("files"), hashes=hashes)
    return f"{ckpt_dir.name}: {problem}" if problem else None


def iter_checkpoint_dirs(run_dir: Path | str) -> Iterator[Path]:
    """Directories under checkpoints/ with a committed name, newest step first (not yet verified)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return iter(())
    dirs = [p for p in root.iterdir() if checkpoint_step(p) is not None]
    return iter(sorted(dirs, key=lambda p: checkpoint_step(p) or 0, reverse=True))


def verified_checkpoints(run_dir: Path | str, *, hashes: bool = True) -> list[tuple[int, Path]]:
    """(step, path) of every committed checkpoint whose manifest verifies, newest first."""
    out = []
    for p in iter_checkpoint_dirs(run_dir):
        if verify_checkpoint(p, hashes=hashes) is None:
            out.append((checkpoint_step(p) or 0, p))
    return out


# =========================================================================================
# failure reports and heartbeats
# =========================================================================================
def write_failure(run_dir: Path | str, attempt: int, cls: str, step: int | None, detail: str,
                  **extra: Any) -> Path:
    """Record why this attempt stopped: ``attempts/<n>/failure.json`` (atomic)."""
    if cls not in FAILURE_CLASSES:
        raise ValueError(f"unknown failure class {cls!r}")
    d = attempt_dir(run_dir, attempt)
    d.mkdir(parents=True, exist_ok=True)
    report = {"class": cls, "step": step, "detail": str(detail)[:2000], "at": now_iso(), **extra}
    path = d / FAILURE_FILE
    atomic_write_json(path, report)
    return path


def read_failure(run_dir: Path | str, attempt: int) -> dict | None:
    """The attempt's failure report if present and well formed; None otherwise (never raises).

    A report of an unknown class, or of the wrong shape, is treated as absent: the orchestrator then
    classifies from the backend, which is what it would do for a job that wrote nothing.
    """
    path = attempt_dir(run_dir, attempt) / FAILURE_FILE
    try:
        if path.is_symlink():
            return None
        r = read_json_bounded(path, limit=256 * 1024)
    except (OSError, ValueError):
        return None
    if not isinstance(r, dict) or r.get("class") not in FAILURE_CLASSES:
        return None
    step = r.get("step")
    # A step outside [0, 2**63) would overflow attempts.failure_step (SQLite INTEGER) and crash every
    # reconciler pass (tests/reliability, R4: {"step": 10**30}); a negative one made the NaN rollback
    # quarantine every checkpoint.
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 2**63):
        r["step"] = None
    return r


def set_aside(path: Path) -> Path | None:
    """Rename ``path`` (e.g. ``failure.json``) to the first free ``<stem>.prev-<k><suffix>``.

    A Slurm in-place requeue reruns the same attempt: what its earlier run wrote must not be read
    as this run's record, and must not be lost either.
    """
    if not path.exists():
        return None
    k = 1
    while (aside := path.with_name(f"{path.stem}.prev-{k}{path.suffix}")).exists():
        k += 1
    os.replace(path, aside)
    fsync_dir(path.parent)
    return aside


def read_run_config(run_dir: Path | str) -> dict[str, Any]:
    """``run_config.json`` as a dict, or {} when absent or unreadable (informative, never a guard)."""
    try:
        r = read_json_bounded(Path(run_dir) / RUN_CONFIG, limit=1 << 20)
    except (OSError, ValueError):
        return {}
    return r if isinstance(r, dict) else {}


def write_progress(run_dir: Path | str, attempt: int, **fields: Any) -> None:
    """Heartbeat: ``attempts/<n>/progress.json`` rewritten atomically (step, loss, tokens/s...)."""
    d = attempt_dir(run_dir, attempt)
    d.mkdir(parents=True, exist_ok=True)
    atomic_write_json(d / PROGRESS_FILE, {"time": time.time(), **fields})


def read_progress(run_dir: Path | str, attempt: int) -> dict | None:
    try:
        r = read_json_bounded(attempt_dir(run_dir, attempt) / PROGRESS_FILE, limit=64 * 1024)
    except (OSError, ValueError):
        return None
    return r if isinstance(r, dict) else None


def stable_run_id(run_dir: Path | str, job: str) -> str:
    """One id per run dir for experiment trackers, so that every attempt continues one curve."""
    return f"{job}-{hashlib.sha256(str(run_dir).encode()).hexdigest()[:8]}"


def job_env(run_dir: Path | str, job: str, attempt: int, overrides: Mapping[str, Any] | None = None,
            token: str | None = None) -> dict[str, str]:
    """Environment variables a job command receives (contract)."""
    env = {ENV_RUN_DIR: str(run_dir), ENV_JOB_NAME: job, ENV_ATTEMPT: str(int(attempt)),
           ENV_OVERRIDES: json.dumps(dict(overrides or {}), sort_keys=True),
           ENV_RUN_ID: stable_run_id(run_dir, job),
           ENV_TENSORBOARD_DIR: str(Path(run_dir) / TENSORBOARD_DIR)}
    if token:
        env[ENV_TOKEN] = token
    return env
