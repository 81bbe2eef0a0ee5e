"""Run directories under the runs root: where a job's run dir is, and confinement to it.

orch never writes or deletes outside its runs root, its trash and its DB: every path here is
checked to be inside one of them, directories are created and entered without following symlinks
(a symlinked ``trash/`` made requeue write outside ORCH_HOME), and a run dir that is a
symlink is refused (it could point anywhere). What goes to the trash, and how: ``orchestrator.ops.trash``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchestrator import protocol
from orchestrator.core.config import Config
from orchestrator.errors import Refused, UsageError


def run_dir_for(cfg: Config, name: str) -> Path:
    protocol.validate_job_name(name)
    return cfg.runs_root / name


def ensure_runs_root(cfg: Config) -> None:
    """Create the runs root (0700) or refuse, naming it: a root under a regular file, or one that
    cannot be created, used to leave the job row ``pending`` for ever."""
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
    and one whose ``attempts/`` is a symlink or not a directory (orch would write through it)."""
    # Lexically under the runs root (every run dir orch names) is under it resolved too: the two realpath walks
    # only for a run dir given another way. They were a fifth of a 1,000-task sweep.
    if run_dir.parent != cfg.runs_root and run_dir.parent.resolve() != cfg.runs_root.resolve():
        raise Refused(f"run dir {run_dir} is not inside the runs root {cfg.runs_root}")
    kind = _kind(run_dir)
    if kind == "link":
        raise Refused(f"run dir {run_dir} is a symlink; orch does not follow it")
    if kind == "other":
        raise Refused(f"run dir {run_dir} exists and is not a directory")
    if kind is None:
        return  # nothing under it either
    p = run_dir / protocol.ATTEMPTS_DIR
    kind = _kind(p)
    if kind == "link":
        raise Refused(f"{p} is a symlink; orch does not write through it")
    if kind == "other":
        raise Refused(f"{p} exists and is not a directory")


def _kind(p: Path) -> str | None:
    """None (absent), "dir", "link" or "other", from one lstat (not followed)."""
    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # a parent is a file: nothing can be written there either
        return "other"
    if stat.S_ISLNK(mode):
        return "link"
    return "dir" if stat.S_ISDIR(mode) else "other"


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
