"""The fence (``fence.json``) a launcher writes before its backend call, and the group slots and batch
directories of a sweep's launch: a stale launch's wrapper reads it and does not run
(docs/decisions/0003-fencing-not-timers.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.protocol.durable import (
    SyncBatch,
    atomic_create,
    atomic_write_json,
    is_int,
    read_json_bounded,
)
from orchestrator.protocol.layout import (
    BATCHES_DIR,
    FENCE_FILE,
    UnsafePath,
    now_iso,
    resolve_inside,
)

FENCE_LIMIT = 4096


def write_fence(attempt_path: Path, token: str, fence: int, batch: SyncBatch | None = None, *,
                group: GroupSlot | None = None) -> None:
    """Record which launch claim of the attempt is the current one (atomic: a wrapper reads the old
    record or the new one, never a torn one). ``batch``: in place only once the batch commits. ``group``:
    the group submission (a Slurm array) this claim's launch goes out in, and the attempt's index in it (for
    people and tools reading the run dir, ``read_group_slot``; orch finds a task's job from its batch's table)."""
    record: dict[str, Any] = {"token": token, "fence": fence, "at": now_iso()}
    if group is not None:
        record["group"], record["task"] = group.token, group.task
    if batch is not None:
        batch.write_json(attempt_path / FENCE_FILE, record)
    else:
        atomic_write_json(attempt_path / FENCE_FILE, record)


def claim_fence(attempt_path: Path, token: str, fence: int, group: GroupSlot) -> bool:
    """A wrapper whose launch left its records in the batch (``BATCH_RECORDS``): its own claim's fence record
    put in place only if the attempt dir has none yet. One a cancel (generation 0) or a re-claimer's launch
    wrote first is kept, and the wrapper's check then finds its launch stale; False when one was there."""
    record = {"token": token, "fence": fence, "at": now_iso(), "group": group.token, "task": group.task}
    return atomic_create(attempt_path / FENCE_FILE, json.dumps(record, sort_keys=True) + "\n")


@dataclass(frozen=True)
class GroupSlot:
    """A group submission's token (``b`` + hex, a name inside the runs root) and one attempt's index in it."""

    token: str
    task: int


_GROUP_TOKEN = re.compile(r"b[0-9a-f]{8,64}")


def is_group_token(value: object) -> bool:
    """Whether ``value`` is a group submission's token (it becomes a path component: ``../x`` must not)."""
    return isinstance(value, str) and _GROUP_TOKEN.fullmatch(value) is not None


def batch_file(runs_root: Path, token: str, name: str) -> Path:
    """``<runs root>/.orch-batches/<token>/<name>``, or UnsafePath when the token is not one or a component is a
    symlink: a symlinked batch dir (or a linked file) led orch's writes and hole punching outside the runs root
    (hostile test)."""
    if not is_group_token(token):
        raise UnsafePath(f"not a batch token: {token!r}")
    return resolve_inside(runs_root, f"{BATCHES_DIR}/{token}/{name}")


def make_batch_dir(runs_root: Path, token: str) -> Path:
    """The batch dir, made (0700) where missing, each component checked to be no symlink before anything is made
    under it; UnsafePath otherwise."""
    if not is_group_token(token):
        raise UnsafePath(f"not a batch token: {token!r}")
    os.makedirs(runs_root, exist_ok=True)
    d = runs_root
    for part in (BATCHES_DIR, token):
        d = d / part
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)
        if d.is_symlink() or not d.is_dir():
            raise UnsafePath(f"{d} is not a directory of orch's (a symlink or a file)")
    return d


def read_fence(attempt_path: Path) -> tuple[str, int] | None:
    """(token, fence) of the attempt dir's fence record; None if absent or malformed."""
    r = _fence_record(attempt_path)
    if r is None or not isinstance(r.get("token"), str) or not is_int(r.get("fence")):
        return None
    return r["token"], int(r["fence"])


def read_group_slot(attempt_path: Path) -> GroupSlot | None:
    """The group submission the attempt's current claim went out in, from its fence record; None for a single
    submission, or a record that does not name a well-formed one (the token becomes a path: a forged
    ``../x`` must lead nowhere)."""
    r = _fence_record(attempt_path)
    if r is None or not is_group_token(r.get("group")) \
            or not is_int(r.get("task")) or int(r["task"]) < 0:
        return None
    return GroupSlot(r["group"], int(r["task"]))


def _fence_record(attempt_path: Path) -> dict[str, Any] | None:
    try:
        r = read_json_bounded(attempt_path / FENCE_FILE, limit=FENCE_LIMIT)
    except (OSError, ValueError):
        return None
    return r if isinstance(r, dict) else None
