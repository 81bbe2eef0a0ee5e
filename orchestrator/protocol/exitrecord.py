"""The exit record (``exit.json``) orch's job wrapper writes when the command ends, and each rank's own end.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.protocol.durable import (
    atomic_write_json,
    is_int,
    read_json_bounded,
)
from orchestrator.protocol.failure import stop_source
from orchestrator.protocol.layout import (
    EXIT_FILE,
    StopSource,
)

EXIT_LIMIT = 64 * 1024

@dataclass(frozen=True)
class ExitRecord:
    """How the command of one attempt ended, as orch's job wrapper recorded it (``exit.json``).

    ``stop_signal``: the termination or warning signal the wrapper delivered to the program (or saw
    delivered to the whole job), None when the program ended on its own. An attempt that was asked
    to stop never gets an ``--outputs`` marker, whatever its exit code (a program that
    exits 0 after SIGTERM is a preempted run, not a finished one).
    """

    token: str
    returncode: int | None
    signal: int | None = None
    ended_at: str = ""
    restart_count: int = 0
    time_limit_reached: bool = False
    stop_signal: str | None = None
    stop_source: StopSource | None = None  # an unknown word reads as None
    notice: str | None = None  # the spot notice behind a "spot_notice" stop, e.g. "aws: terminate at ..."
    marker_error: str | None = None
    error: str | None = None
    disk_full: bool = False  # the wrapper's own writes hit ENOSPC: the run dir's filesystem was full
    # Where the wrapper moved a done.json the program wrote itself and then exited non-zero or was stopped.
    marker_set_aside: str | None = None
    oom_kill: int | None = None  # OOM kills the attempt's memory cgroup counted (None: no cgroup; memlimit.py)
    # Where it ran: ranks orch launched (None: the program's own business, e.g. its own torchrun) and
    # the nodes (Slurm's SLURM_JOB_NODELIST, e.g. "gpu[01-02]"; locally the hostname).
    world_size: int | None = None
    nodes: str | None = None
    # The rank whose program failed on its own first, and how (Popen's returncode: -9 is SIGKILL), when orch
    # launched the ranks (jobside/rankend.py): torchrun exits 1 for a rank's kill -9 too, which read as crash.
    failed_rank: int | None = None
    rank_returncode: int | None = None
    # When the program's own process ended, before the wrapper stopped what it left running: a stop
    # record written after this came from a leftover, not from the program's end.
    program_ended_at: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def write_exit(attempt_path: Path, record: ExitRecord) -> None:
    atomic_write_json(attempt_path / EXIT_FILE, {**record.as_dict(), "time": time.time()})


def read_exit(attempt_path: Path, token: str | None = None) -> ExitRecord | None:
    """The wrapper's exit record if present, well formed and (when ``token`` is given) this attempt's.

    A record of another attempt (a run dir reused under a fresh DB) or of the wrong shape is None:
    every field is type- and range-checked, since the job itself can write this file.
    """
    return read_exit_at(attempt_path / EXIT_FILE, token)


def read_exit_at(path: Path, token: str | None) -> ExitRecord | None:
    try:
        r = read_json_bounded(path, limit=EXIT_LIMIT)
    except (OSError, ValueError):
        return None
    if not isinstance(r, dict) or not isinstance(r.get("token"), str):
        return None
    if token is not None and r["token"] != token:
        return None
    rc, sig = r.get("returncode"), r.get("signal")

    def text(k: str) -> str | None:
        v = r.get(k)
        return v[:500] if isinstance(v, str) else None

    return ExitRecord(
        token=r["token"],
        returncode=rc if is_int(rc, -255, 255) else None,
        signal=sig if is_int(sig, 1, 128) else None,
        ended_at=text("ended_at") or "",
        restart_count=r["restart_count"] if is_int(r.get("restart_count"), 0, 10**6) else 0,
        time_limit_reached=r.get("time_limit_reached") is True,
        stop_signal=text("stop_signal"),
        stop_source=stop_source(r.get("stop_source")),
        notice=text("notice"),
        marker_error=text("marker_error"),
        error=text("error"),
        disk_full=r.get("disk_full") is True,
        marker_set_aside=text("marker_set_aside"),
        oom_kill=r["oom_kill"] if is_int(r.get("oom_kill"), 0, 10**9) else None,
        world_size=r["world_size"] if is_int(r.get("world_size"), 1, 10**7) else None,
        nodes=text("nodes"),
        **_rank_end(r),
        program_ended_at=text("program_ended_at") or "",
    )


# A rank's end as Popen's returncode: an exit code, or minus a signal number (jobside/rankend.py writes it).
RANK_RETURNCODE_MIN, RANK_RETURNCODE_MAX = -64, 255


def _rank_end(r: Mapping[str, Any]) -> dict[str, int]:
    """failed_rank and rank_returncode, both or neither: a rank's clean exit (0) is never an attempt's end."""
    rank, rc = r.get("failed_rank"), r.get("rank_returncode")
    if not is_int(rank, 0, 10**7) or not is_int(rc, RANK_RETURNCODE_MIN, RANK_RETURNCODE_MAX) or rc == 0:
        return {}
    return {"failed_rank": rank, "rank_returncode": rc}
