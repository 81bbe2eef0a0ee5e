"""Run directories under the runs root: where a job's run dir is, and confinement to it.

orch never writes or deletes outside its runs root, its trash and its DB: every path here is
checked to be inside one of them, directories are created and entered without following symlinks
(issue 9: a symlinked ``trash/`` made requeue write outside ORCH_HOME), and a run dir that is a
symlink is refused (it could point anywhere). What goes to the trash, and how: ``orchestrator.trash``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchestrator import protocol
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
