"""``trackers.json``: the tracker runs a job's attempts all log to, one entry per tracker.

Two writers, never at once: the job wrapper records the MLflow run it arranged before the program starts
(``jobside/mlflowrun.py``); the program's kit records the W&B run it found the program logging to
(``kit/wandbrecord.py``). Each replaces only its own entry. When orch decides the job's end, a detached child
marks each recorded run (``core/trackerend.py``, ``jobside/trackerfinish.py``).

The file is the job's to write: every reader checks each field's type, and a malformed entry is no run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from orchestrator.protocol.durable import atomic_write_json, read_json_bounded
from orchestrator.protocol.layout import TRACKERS_FILE

# What W&B accepts as a run id (letters, digits, _ and -) and as an entity or project name (no / \ # ? % :);
# anything else is not a run orch would pass to wandb.init
_WANDB_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_WANDB_NAME_RE = re.compile(r"^[^/\\#?%:\x00-\x1f]{0,128}$")
WANDB_MODES = ("online", "offline")


def read_trackers(run_dir: Path | str) -> dict[str, dict[str, Any]]:
    """Every entry of the run dir's ``trackers.json`` that is an object ({} when none, or unreadable)."""
    try:
        data = read_json_bounded(Path(run_dir) / TRACKERS_FILE)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, dict)}


def write_tracker(run_dir: Path | str, name: str, rec: dict[str, Any]) -> None:
    """Replace entry ``name`` of ``trackers.json`` (atomic), keeping the other trackers' entries."""
    atomic_write_json(Path(run_dir) / TRACKERS_FILE, {**read_trackers(run_dir), name: rec})


def wandb_record(run_dir: Path | str) -> dict[str, str] | None:
    """The W&B run the kit recorded (``run_id``, ``project``, ``entity``, ``mode``, ``root_dir``, maybe ``end``),
    each field checked; None when there is none or any field is not what W&B itself would accept."""
    rec = read_trackers(run_dir).get("wandb")
    if rec is None:
        return None
    fields = {k: rec.get(k) for k in ("run_id", "project", "entity", "mode", "root_dir")}
    if not all(isinstance(v, str) for v in fields.values()):
        return None
    ok = (_WANDB_ID_RE.fullmatch(fields["run_id"]) and _WANDB_NAME_RE.fullmatch(fields["project"])
          and _WANDB_NAME_RE.fullmatch(fields["entity"]) and fields["mode"] in WANDB_MODES
          and fields["root_dir"].startswith("/") and len(fields["root_dir"]) <= 4096 and "\0" not in fields["root_dir"])
    if not ok:
        return None
    if isinstance(rec.get("end"), str):
        fields["end"] = rec["end"][:64]
    return fields  # type: ignore[return-value]
