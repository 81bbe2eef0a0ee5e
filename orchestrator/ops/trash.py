"""The trash that requeue and policy move things into, and what they may move there.

Things are moved to the trash (a rename) rather than deleted, so a wrong decision can be undone until
``orch gc``; the trash is entered like a run dir, never through a symlink (``rundir.make_dir_nofollow``).

What orch may move is only what it can prove is its own or unverified in its own format: an
unverified ``done.json``, ``result/``, files matching ``--outputs``, and under ``checkpoints/`` the
``step-<8 digits>`` dirs that do not verify (sha256, not sizes) and their ``.tmp-`` leftovers. A
user's own files there (``checkpoints/ckpt.pt``) stay, and ``orch show`` names them.
"""

from __future__ import annotations

import errno
import glob
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from orchestrator import protocol
from orchestrator.core import resumestate
from orchestrator.core.config import Config
from orchestrator.core.rundir import make_dir_nofollow


def _trash_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{time.time_ns() % 10**9:09d}"


def move_to_trash(cfg: Config, run_dir: Path, rels: Iterable[str], job: str) -> list[str]:
    """Rename ``run_dir/rel`` for each rel into ``$ORCH_HOME/trash/<job>/<stamp>/rel``.

    Falls back to ``<runs_root>/.orch-trash`` when the trash is on another filesystem (a rename
    cannot cross filesystems, and a copy+delete is not atomic). Returns what was moved.
    """
    rels = list(rels)
    if not rels:
        return []
    moved = []
    stamp = _trash_stamp()
    for rel in rels:
        head, _, last = protocol.safe_relpath(rel).rpartition("/")
        # Intermediate components must be real dirs; the last may be a symlink (rename moves the link).
        src = (protocol.resolve_inside(run_dir, head) if head else run_dir) / last
        if not (src.exists() or src.is_symlink()):
            continue
        dest_rel = Path(job) / stamp / rel
        dest_dir = make_dir_nofollow(cfg.trash, dest_rel.parent)
        try:
            os.rename(src, dest_dir / last)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            dest_dir = make_dir_nofollow(cfg.runs_root, Path(".orch-trash") / dest_rel.parent)
            os.rename(src, dest_dir / last)
        moved.append(rel)
        protocol.fsync_dir(dest_dir)  # the entry that now holds it survives a crash too
    protocol.fsync_dir(run_dir)
    return moved


def unverified_leftovers(run_dir: Path, outputs: list[str], quarantine: Iterable[str] = (),
                         keep: Iterable[str] = ()) -> list[str]:
    """The paths of ``leftovers_why``."""
    return [rel for rel, _why in leftovers_why(run_dir, outputs, quarantine, keep)]


def leftovers_why(run_dir: Path, outputs: list[str], quarantine: Iterable[str] = (),
                  keep: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(path, why) of what the next attempt must not see and orch can prove is its own; verified
    checkpoints, attempt records, a user's other files and resume state (``resumestate.kept``: HF
    ``checkpoint-N``, Lightning ``*.ckpt``, ``--keep`` globs) stay, even inside ``--outputs``.

    Never called on a run dir whose marker verifies (callers check first: seed 000's lesson is that
    only the marker decides). Hashes every committed checkpoint (a same-size bit flip is corrupt).
    """
    if not run_dir.is_dir() or run_dir.is_symlink():
        return []
    # `--outputs 'out/*'` over HF's output_dir sent out/checkpoint-* to the trash; the next
    # attempt restarted from step 1.
    state = resumestate.kept(run_dir, keep)
    out: dict[str, str] = {}

    def add(rel: str, why: str) -> None:
        for r in resumestate.clearable(run_dir, rel, state):
            out.setdefault(r, why)

    if (run_dir / protocol.DONE_MARKER).exists() or (run_dir / protocol.DONE_MARKER).is_symlink():
        add(protocol.DONE_MARKER, "a done marker that does not verify")
    if (run_dir / protocol.RESULT_DIR).exists() or (run_dir / protocol.RESULT_DIR).is_symlink():
        add(protocol.RESULT_DIR, "an unverified result")
    for pat in outputs:
        for hit in glob.glob(pat, root_dir=run_dir, recursive=True):
            rel = os.path.normpath(hit)
            if rel.split("/")[0] not in (protocol.ATTEMPTS_DIR, protocol.CHECKPOINTS_DIR):
                add(rel, f"an unverified output (--outputs {pat})")
    quarantine = set(quarantine)
    ck = run_dir / protocol.CHECKPOINTS_DIR
    if ck.is_dir() and not ck.is_symlink():
        for p in sorted(ck.iterdir()):
            rel = f"{protocol.CHECKPOINTS_DIR}/{p.name}"
            if rel in quarantine:
                out.setdefault(rel, "quarantined by the policy (NaN rollback)")
            elif protocol.checkpoint_step(p) is not None:
                if (bad := protocol.verify_checkpoint_bounded(p)) is not None:
                    out.setdefault(rel, f"a checkpoint that does not verify: {bad}")
            elif protocol.TMP_INFIX in p.name and protocol.OWN_CHECKPOINT_RE.match(p.name):
                out.setdefault(rel, "a checkpoint write that never committed")  # step-<8 digits>.tmp-...
    return list(out.items())


def empty_trash(cfg: Config, job: str | None = None) -> int:
    """Delete trashed items (all, or one job's). Returns the number of entries removed.

    Never follows a symlink: a symlinked trash (or trash/<job>) is skipped, not emptied through.
    """
    n = 0
    for root in (cfg.trash, cfg.runs_root / ".orch-trash"):
        base = root / job if job else root
        if root.is_symlink() or base.is_symlink() or not base.is_dir():
            continue
        for entry in list(base.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            n += 1
    return n
