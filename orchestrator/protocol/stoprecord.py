"""The kit's stop record (``stop.json``): the program received a stop signal; such an attempt is never
verified.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.protocol.durable import (
    MAX_DB_INT,
    atomic_write_json,
    is_int,
    read_json_bounded,
)
from orchestrator.protocol.layout import (
    STOP_FILE,
)

STOP_LIMIT = 16 * 1024
@dataclass(frozen=True)
class StopRecord:
    """``attempts/<n>/stop.json``: the program's kit received a stop signal (from orch, Slurm, a user's kill,
    a container stop, a VM shutdown) at ``at``; ``step``: the last completed step, filled at the next step
    boundary. An attempt with this record is never verified, whatever its exit code (an HF
    script with enable_jit_checkpoint exited 0 after SIGTERM and was verified half-trained)."""

    signal: str
    at: str
    step: int | None = None


def write_stop(attempt_path: Path, signal_name: str, at: str, step: int | None, token: str | None) -> None:
    attempt_path.mkdir(parents=True, exist_ok=True)
    atomic_write_json(attempt_path / STOP_FILE, {"signal": signal_name, "at": at, "step": step, "token": token})


def read_stop(attempt_path: Path, token: str | None = None) -> StopRecord | None:
    """The attempt's stop record, validated (and of ``token`` when given); None when absent or bad.

    A stop.json that exists but does not parse is still a stop: the kit writes it atomically, so garbage
    there came from elsewhere, and "stopped" is the safe reading (never verified, retried).
    """
    path = attempt_path / STOP_FILE
    try:
        r = read_json_bounded(path, limit=STOP_LIMIT)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return StopRecord(signal="unknown", at="", step=None) if (path.exists() or path.is_symlink()) else None
    if not isinstance(r, dict):
        return StopRecord(signal="unknown", at="", step=None)
    if token is not None and isinstance(r.get("token"), str) and r["token"] != token:
        return None  # another attempt's (a run dir reused under a fresh DB)
    sig, at, step = r.get("signal"), r.get("at"), r.get("step")
    return StopRecord(signal=sig[:32] if isinstance(sig, str) and sig.isprintable() else "unknown",
                      at=at[:64] if isinstance(at, str) else "",
                      step=step if is_int(step, 0, MAX_DB_INT) else None)
