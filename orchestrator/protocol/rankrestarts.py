"""Restarts of a multi-rank program's ranks inside the job's own allocation (``--rank-restarts``): the record.

The wrapper writes ``attempts/<n>/rank_restarts.json`` before each relaunch of the ranks; ``orch show``, goodput
and the metrics read it. A Slurm in-place rerun of the attempt is another thing (``restarts.py``): the scheduler
ran the attempt again through its queue; a rank restart never left the allocation.

Job-writable like every run-dir record: read bounded, of the attempt's token only, each field checked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from orchestrator.protocol.durable import atomic_write_json, finite_number, is_int, read_json_bounded
from orchestrator.protocol.layout import FAILURE_CLASSES, RANK_RESTARTS_DIR, RANK_RESTARTS_FILE

RANK_RESTARTS_LIMIT = 256 * 1024
_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_RANK_RESTARTS = 100  # what a job may ask for, and what is read back


def rank_restart_dir(attempt_path: Path, k: int) -> Path:
    """``attempts/<n>/rank-restarts/<k>/``: the reports of the launch the k-th rank restart replaced."""
    return attempt_path / RANK_RESTARTS_DIR / str(k)


def read_rank_restarts(attempt_path: Path, token: str | None) -> list[dict[str, Any]]:
    """Each rank restart of one attempt, oldest first: ``{"at", "failed_rank", "rank_returncode", "class",
    "failed_step", "resume_step"}`` (a field the record lacks or got wrong reads None; the class is a known
    failure class). [] when absent, of another token, or not a record."""
    try:
        r = read_json_bounded(attempt_path / RANK_RESTARTS_FILE, limit=RANK_RESTARTS_LIMIT)
    except (OSError, ValueError):
        return []
    if not isinstance(r, dict) or not isinstance(r.get("restarts"), list):
        return []
    if token is not None and r.get("token") != token:
        return []
    out = []
    for e in r["restarts"][:MAX_RANK_RESTARTS]:
        if not isinstance(e, dict):
            continue
        out.append({
            "at": finite_number(e.get("at")),
            "failed_rank": e["failed_rank"] if is_int(e.get("failed_rank"), 0, 10**7) else None,
            "rank_returncode": e["rank_returncode"] if is_int(e.get("rank_returncode"), -255, 255) else None,
            "class": e["class"] if e.get("class") in FAILURE_CLASSES else "unknown",
            "failed_step": e["failed_step"] if is_int(e.get("failed_step"), 0, 10**15) else None,
            "resume_step": e["resume_step"] if is_int(e.get("resume_step"), 0, 10**15) else None,
            "lost_nodes": _node_names(e.get("lost_nodes")),
        })
    return out


def _node_names(v: object) -> list[str]:
    """A record's lost nodes: node names only (the wrapper passes them to srun's --nodelist)."""
    if not isinstance(v, list):
        return []
    return [n for n in v[:1000] if isinstance(n, str) and _NODE_RE.match(n)]


def append_rank_restart(attempt_path: Path, token: str, entry: dict[str, Any]) -> int:
    """Add one rank restart to the attempt's record (atomically rewritten); returns how many it now holds."""
    stored = read_rank_restarts(attempt_path, token)
    restarts = [*stored, entry]
    atomic_write_json(attempt_path / RANK_RESTARTS_FILE, {"token": token, "restarts": restarts})
    return len(restarts)


__all__ = ["MAX_RANK_RESTARTS", "RANK_RESTARTS_LIMIT", "append_rank_restart", "rank_restart_dir",
           "read_rank_restarts"]
