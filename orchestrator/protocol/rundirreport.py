"""What ``orch show`` says of a run dir beyond the DB: the user's own files under checkpoints/, and the
job-written records orch refused to read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.protocol.durable import (
    read_json_bounded,
)
from orchestrator.protocol.exitrecord import EXIT_LIMIT
from orchestrator.protocol.failure import FAILURE_LIMIT
from orchestrator.protocol.layout import (
    ATTEMPTS_DIR,
    CHECKPOINTS_DIR,
    EXIT_FILE,
    FAILURE_FILE,
    OWN_CHECKPOINT_RE,
    PROGRESS_FILE,
    attempt_dir,
)
from orchestrator.protocol.progress import PROGRESS_LIMIT


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
