"""Run directories under the runs root, and the trash that requeue and policy move things into.

orch never writes or deletes outside its runs root, its trash and its DB: every path here is
checked to be inside one of them, directories are created and entered without following symlinks
(issue 9: a symlinked ``trash/`` made requeue write outside ORCH_HOME), and a run dir that is a
symlink is refused (it could point anywhere). Things are moved to the trash (a rename) rather than
deleted, so a wrong decision can be undone until ``orch gc``.

What orch may move is only what it can prove is its own or unverified in its own format: an
unverified ``done.json``, ``result/``, files matching ``--outputs``, and under ``checkpoints/`` the
``step-<8 digits>`` dirs that do not verify (sha256, not sizes) and their ``.tmp-`` leftovers. A
user's own files there (``checkpoints/ckpt.pt``) stay, and ``orch show`` names them (issue 10).
"""

from __future__ import annotations

import errno
import glob
import os
import shutil
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from orchestrator import protocol, resumestate
from orchestrator.config import Config
from orchestrator.errors import Refused, UsageError


def run_dir_for(cfg: Config, name: str) -> Path:
    protocol.validate_job_name(name)
    return cfg.runs_root / name


def ensure_runs_root(cfg: Config) -> None:
    """Create the runs root (0700) or refuse, naming it: a root under a regular file, or one that
    cannot be created, used to leave the job row ``pending`` for ever (issue 9)."""
    root = cfg.runs_root
    try:
        root.mkdir(mode=0o770, parents=True, exist_ok=True)  # the umask decides: 0700, or 0750 when group_shared
        st = os.stat(root)
    except OSError as e:
        raise UsageError(f"runs root {root} is unusable: {e.strerror or e}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"runs root {root} is not a directory")
    if not os.access(root, os.W_OK | os.X_OK):
        raise UsageError(f"runs root {root} is not writable")


def check_run_dir(cfg: Config, run_dir: Path) -> None:
    """Refuse a run dir that is a symlink, not a directory, or not directly under the runs root,
    and one whose ``attempts/`` or ``checkpoints/`` is a symlink (orch would write through it)."""
    if run_dir.parent.resolve() != cfg.runs_root.resolve():
        raise Refused(f"run dir {run_dir} is not inside the runs root {cfg.runs_root}")
    if run_dir.is_symlink():
        raise Refused(f"run dir {run_dir} is a symlink; orch does not follow it")
    if run_dir.exists() and not run_dir.is_dir():
        raise Refused(f"run dir {run_dir} exists and is not a directory")
    for sub in (protocol.ATTEMPTS_DIR,):
        p = run_dir / sub
        if p.is_symlink():
            raise Refused(f"{p} is a symlink; orch does not write through it")
        if p.exists() and not p.is_dir():
            raise Refused(f"{p} exists and is not a directory")


def make_dir_nofollow(base: Path, rel: Path | str, mode: int = 0o700) -> Path:
    """``base/rel``, each missing component created with ``mode``; every component (``base``
    included) must be a real directory, never a symlink. Raises Refused otherwise."""
    base.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # ORCH_HOME itself: checked by db.prepare_home
    chain = [base]
    for part in Path(rel).parts:
        chain.append(chain[-1] / part)
    for p in chain:
        try:
            os.mkdir(p, mode)
        except FileExistsError:
            pass
        except OSError as e:
            raise Refused(f"cannot create {p}: {e.strerror or e}") from None
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            raise Refused(f"{p} is a symlink; orch does not write through it")
        if not stat.S_ISDIR(st.st_mode):
            raise Refused(f"{p} is not a directory")
    return chain[-1]


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
    # Issue 17: `--outputs 'out/*'` over HF's output_dir sent out/checkpoint-* to the trash; the next
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
