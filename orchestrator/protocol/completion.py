"""The kit's completion record (``complete.json``): the job says it completed, and which outputs it wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.protocol.durable import (
    MAX_DB_INT,
    atomic_write_json,
    is_int,
    read_json_bounded,
)
from orchestrator.protocol.layout import (
    COMPLETE_FILE,
    RESULT_DIR,
    UnsafePath,
    attempt_dir,
    now_iso,
    safe_relpath,
)

COMPLETE_LIMIT = 256 * 1024
MAX_OUTPUTS = 1000


@dataclass(frozen=True)
class CompletionRecord:
    """``attempts/<n>/complete.json``: the program's kit says training completed and what it produced.

    Written instead of done.json under orch's wrapper, which writes the marker only after the program
    exits 0 (the callbacks' done.json verified a script that raised in its export right after).
    ``outputs``: run-dir-relative paths or globs; one ending in ``/`` is everything under that dir.
    """

    token: str
    step: int | None
    at: str
    outputs: tuple[str, ...]

    def patterns(self) -> list[str]:
        """The outputs as ``glob`` patterns (a dir ``x/`` becomes ``x/**``)."""
        return [o + "**" if o.endswith("/") else o for o in self.outputs]


def write_completion(run_dir: Path | str, attempt: int, token: str, step: int | None,
                     outputs: list[str]) -> Path:
    """Record that training completed: ``attempts/<n>/complete.json`` (atomic). ``result/`` is always listed."""
    outs = [f"{RESULT_DIR}/"] + [o for o in outputs if o != f"{RESULT_DIR}/"]
    d = attempt_dir(run_dir, attempt)
    d.mkdir(parents=True, exist_ok=True)
    path = d / COMPLETE_FILE
    atomic_write_json(path, {"token": token, "step": step, "at": now_iso(), "outputs": outs})
    return path


def _clean_output(o: Any) -> str | None:
    """A record's output path/glob if it stays inside the run dir (no ``/``-rooted, ``..``, NUL), else None."""
    if not isinstance(o, str) or len(o) > 500:
        return None
    try:
        safe_relpath(o[:-1] if o.endswith("/") else o)
    except UnsafePath:
        return None
    return o


def read_completion(attempt_path: Path, token: str) -> CompletionRecord | None:
    """This attempt's completion record (the token must match), validated; None when absent or bad.

    The job writes it: outputs that could leave the run dir are dropped, never followed.
    """
    try:
        r = read_json_bounded(attempt_path / COMPLETE_FILE, limit=COMPLETE_LIMIT)
    except (OSError, ValueError):
        return None
    if not isinstance(r, dict) or r.get("token") != token or not isinstance(r.get("outputs"), list):
        return None
    outs = tuple(o for o in (_clean_output(x) for x in r["outputs"][:MAX_OUTPUTS]) if o is not None)
    step = r.get("step")
    at = r.get("at")
    return CompletionRecord(token=token, step=step if is_int(step, 0, MAX_DB_INT) else None,
                            at=at[:64] if isinstance(at, str) else "", outputs=outs)
