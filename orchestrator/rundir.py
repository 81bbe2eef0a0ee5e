"""Run directories under the runs root, and the trash that requeue and policy move things into.

orch never writes or deletes outside its runs root, its trash and its DB: every path here is
checked to be inside one of them, and a run dir that is a symlink is refused (it could point
anywhere). Things are moved to the trash (a rename) rather than deleted, so a wrong decision can
be undone until ``orch gc``.
"""

from __future__ import annotations

import errno
import glob
import os
import shutil
import time
from pathlib import Path

from orchestrator import protocol
from orchestrator.config import Config
from orchestrator.errors import Refused


def run_dir_for(cfg: Config, name: str) -> Path:
    protocol.validate_job_name(name)
    return cfg.runs_root / name


def check_run_dir(cfg: Config, run_dir: Path) -> None:
    """Refuse a run dir that is a symlink or not directly under the runs root."""
    if run_dir.parent.resolve() != cfg.runs_root.resolve():
        raise Refused(f"run dir {run_dir} is not inside the runs root {cfg.runs_root}")
    if run_dir.is_symlink():
        raise Refused(f"run dir {run_dir} is a symlink; orch does not follow it")
    if run_dir.exists() and not run_dir.is_dir():
        raise Refused(f"run dir {run_dir} exists and is not a directory")


def _trash_dir(cfg: Config, job: str) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{time.time_ns() % 10**9:09d}"
    return cfg.trash / job / stamp


def move_to_trash(cfg: Config, run_dir: Path, rels: list[str], job: str) -> list[str]:
    """Rename ``run_dir/rel`` for each rel into ``$ORCH_HOME/trash/<job>/<stamp>/rel``.

    Falls back to ``<runs_root>/.orch-trash`` when the trash is on another filesystem (a rename
    cannot cross filesystems, and a copy+delete is not atomic). Returns what was moved.
    """
    if not rels:
        return []
    moved = []
    dest_root = _trash_dir(cfg, job)
    for rel in rels:
        head, _, last = protocol.safe_relpath(rel).rpartition("/")
        # Intermediate components must be real dirs; the last may be a symlink (rename moves the link).
        src = (protocol.resolve_inside(run_dir, head) if head else run_dir) / last
        if not (src.exists() or src.is_symlink()):
            continue
        dest = dest_root / rel
        try:
            dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.rename(src, dest)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            dest = cfg.runs_root / ".orch-trash" / dest_root.relative_to(cfg.trash) / rel
            dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.rename(src, dest)
        moved.append(rel)
        protocol.fsync_dir(dest.parent)  # the entry that now holds it survives a crash too
    protocol.fsync_dir(run_dir)
    return moved


def unverified_leftovers(run_dir: Path, outputs: list[str], quarantine: list[str] = ()) -> list[str]:
    """What the next attempt must not see; verified checkpoints and attempt records stay.

    A done.json that does not verify, partial results, uncommitted or corrupt checkpoint dirs and
    checkpoints the policy quarantined (e.g. those written after a NaN). Never called on a run dir
    whose marker verifies (callers check first: seed 000's lesson is that only the marker decides).
    """
    if not run_dir.is_dir():
        return []
    out: list[str] = []
    if (run_dir / protocol.DONE_MARKER).exists() or (run_dir / protocol.DONE_MARKER).is_symlink():
        out.append(protocol.DONE_MARKER)
    if (run_dir / protocol.RESULT_DIR).exists():
        out.append(protocol.RESULT_DIR)
    for pat in outputs:
        for hit in glob.glob(pat, root_dir=run_dir, recursive=True):
            rel = os.path.normpath(hit)
            if rel.split("/")[0] not in (protocol.ATTEMPTS_DIR, protocol.CHECKPOINTS_DIR) and rel not in out:
                out.append(rel)
    ck = run_dir / protocol.CHECKPOINTS_DIR
    if ck.is_dir() and not ck.is_symlink():
        for p in sorted(ck.iterdir()):
            rel = f"{protocol.CHECKPOINTS_DIR}/{p.name}"
            if rel in quarantine or protocol.verify_checkpoint(p, hashes=False) is not None:
                out.append(rel)
    elif ck.is_symlink():
        out.append(protocol.CHECKPOINTS_DIR)
    return out


def empty_trash(cfg: Config, job: str | None = None) -> int:
    """Delete trashed items (all, or one job's). Returns the number of entries removed."""
    n = 0
    for root in (cfg.trash, cfg.runs_root / ".orch-trash"):
        base = root / job if job else root
        if not base.is_dir() or base.is_symlink():
            continue
        for entry in list(base.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            n += 1
    return n
