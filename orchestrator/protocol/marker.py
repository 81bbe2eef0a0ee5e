"""The terminal marker (THE completion predicate) and committed checkpoints: both are a manifest
of ``{relpath: {size, sha256}}`` written last, atomically, over files that were fsynced first.

Why a file decides "finished", not the job table: docs/decisions/0002-the-marker-decides.md."""

from __future__ import annotations

import enum
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.protocol.durable import atomic_write_json, fsync_dir, read_json_bounded, sha256_file
from orchestrator.protocol.layout import (
    CHECKPOINT_RE,
    CHECKPOINTS_DIR,
    DONE_MARKER,
    MANIFEST,
    REJECTED_MARKER_PREFIX,
    SCHEMA,
    UnsafePath,
    now_iso,
    resolve_inside,
    safe_relpath,
)


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
class MarkerStatus(enum.StrEnum):
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
    try:
        run_dir_is_link = stat.S_ISLNK(os.lstat(run_dir).st_mode)
    except FileNotFoundError:  # one syscall, not three, for each new task of a sweep
        return Verification(MarkerStatus.ABSENT, f"no {DONE_MARKER}")
    except OSError:
        run_dir_is_link = run_dir.is_symlink()  # as before: pathlib's answer (or error) for the odd cases
    if run_dir_is_link:
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


def set_aside_marker(run_dir: Path | str) -> Path | None:
    """Rename ``done.json`` to the first free ``done.rejected-<k>.json`` (never the marker's name); None if absent.

    orch's wrapper does this to a done.json the program wrote itself and then exited non-zero or was
    stopped: kept for the user to read, never verified.
    """
    path = Path(run_dir) / DONE_MARKER
    if not (path.exists() or path.is_symlink()):
        return None
    k = 1
    while (aside := path.with_name(f"{REJECTED_MARKER_PREFIX}{k}.json")).exists() or aside.is_symlink():
        k += 1
    os.replace(path, aside)
    fsync_dir(path.parent)
    return aside


# =========================================================================================
# checkpoints: committed = name step-<8 digits> + a manifest that verifies
# =========================================================================================
def checkpoint_step(path: Path) -> int | None:
    m = CHECKPOINT_RE.fullmatch(path.name)
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


# The controller (requeue, rollback, the launch's trash pass) hashes a checkpoint only when it is small and
# single-writer: hashing runs at ~2 GB/s per core, so a 500 GB checkpoint would hold the login node (and the
# allocation waiting for the decision) for minutes. Larger and sharded ones get the manifest and sizes here;
# their loaders hash every byte before loading (the sharded one in parallel across ranks) and fall back to the
# previous committed step as a whole when one byte differs.
CONTROLLER_HASH_BYTES = 256 << 20
SHARDED_FORMAT = "orch-sharded-1"


def verify_checkpoint_bounded(ckpt_dir: Path, hash_budget: int = CONTROLLER_HASH_BYTES) -> str | None:
    """``verify_checkpoint`` as the controller runs it: every sha256 only for a single-writer checkpoint of at
    most ``hash_budget`` bytes, else the manifest and the sizes."""
    problem = verify_checkpoint(ckpt_dir, hashes=False)
    if problem is not None:
        return problem
    m = read_json_bounded(ckpt_dir / MANIFEST)
    total = sum(meta["size"] for meta in m["files"].values())
    if m.get("format") == SHARDED_FORMAT or total > hash_budget:
        return None
    return verify_checkpoint(ckpt_dir)


def iter_checkpoint_dirs(run_dir: Path | str) -> Iterator[Path]:
    """Directories under checkpoints/ with a committed name, newest step first (not yet verified)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if root.is_symlink() or not root.is_dir():  # a symlinked checkpoints/ could point anywhere
        return iter(())
    dirs = [p for p in root.iterdir() if checkpoint_step(p) is not None]
    return iter(sorted(dirs, key=lambda p: checkpoint_step(p) or 0, reverse=True))


def expected_resume_step(run_dir: Path | str, attempt: int, overrides: Mapping[str, Any]) -> int | None:
    """The step an attempt will resume from, as the run dir tells before the program starts (``ORCH_RESUME_STEP``):
    the policy's rollback target, else the newest committed checkpoint whose manifest and sizes verify, else 0 on
    a first attempt's fresh start. None when it cannot be known: a later attempt with no committed checkpoint may
    be a program that keeps its own. The kit, which hashes what it restores, corrects it in-process."""
    wanted = overrides.get("resume")
    if wanted == "none":
        return 0
    if isinstance(wanted, str) and wanted:
        return checkpoint_step(Path(wanted))
    for p in iter_checkpoint_dirs(run_dir):
        if verify_checkpoint(p, hashes=False) is None:
            return checkpoint_step(p)
    return 0 if attempt == 1 else None


def verified_checkpoints(run_dir: Path | str, *, hashes: bool = True) -> list[tuple[int, Path]]:
    """(step, path) of every committed checkpoint whose manifest verifies, newest first."""
    out = []
    for p in iter_checkpoint_dirs(run_dir):
        if verify_checkpoint(p, hashes=hashes) is None:
            out.append((checkpoint_step(p) or 0, p))
    return out


