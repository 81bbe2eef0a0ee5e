"""The run-dir files an attempt writes besides checkpoints: program.json, run_config.json, failure.json.

Everything goes through ``orchestrator.protocol`` (atomic, fsynced writes; the contract's names).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orch_trainer.ranks import Ranks
from orchestrator import protocol
from orchestrator.kit.run import RANK_FAILURE

# What command.json keeps of the environment: enough to see where and how an attempt ran, never
# the whole environment (it may hold tokens).
_ENV_KEYS = ("ORCH_RUN_DIR", "ORCH_JOB_NAME", "ORCH_ATTEMPT", "ORCH_OVERRIDES", "SLURM_JOB_ID",
             "SLURM_RESTART_COUNT", "SLURM_ARRAY_TASK_ID", "SLURM_NODELIST", "CUDA_VISIBLE_DEVICES",
             "WANDB_RUN_ID", "WANDB_RESUME", "PYTHONPATH")


def log(msg: str) -> None:
    print(f"[trainer] {msg}", file=sys.stderr, flush=True)


def write_program(run_dir: Path, attempt: int, argv: Sequence[str], environ: dict[str, str]) -> None:
    """attempts/<n>/program.json: how this attempt's program started. A record only, never a guard
    (seed 000); orch's own command.json (what it launched, with the attempt's token) is left as it is."""
    protocol.atomic_write_json(protocol.attempt_dir(run_dir, attempt) / protocol.PROGRAM_FILE, {
        "argv": [sys.executable, "-m", "orch_trainer", *argv],
        "env": {k: environ[k] for k in _ENV_KEYS if k in environ},
        "time": protocol.now_iso(), "pid": os.getpid(), "host": socket.gethostname(), "cwd": os.getcwd(),
    })


def set_aside_stale_failure(run_dir: Path, attempt: int) -> Path | None:
    """Rename a failure.json left by an earlier run of the SAME attempt (Slurm in-place requeue).

    Slurm's ``--requeue`` restarts the script with the same job id, so ORCH_ATTEMPT is unchanged and
    the previous run's report would otherwise be read as this run's outcome.
    """
    return protocol.set_aside(protocol.attempt_dir(run_dir, attempt) / protocol.FAILURE_FILE)


def report_failure(run_dir: Path, attempt: int, cls: str, step: int | None, detail: str,
                   **extra: Any) -> bool:
    """Write failure.json; if even that fails (a full disk), say the class on stderr. True if written.

    A rank other than 0 of several never writes failure.json (rank 0 reports the attempt): it writes its own
    ``failure.rank-<r>.json`` (the kit's name, read by ``Run.crashed`` on a peer that lost it), and nothing for a
    stop, which every rank takes at the same step and rank 0 reports."""
    log(f"failure class={cls} step={step}: {detail}")
    ranks = Ranks.from_env()
    try:
        if not ranks.is_writer:
            if cls != "preempted":
                adir = protocol.attempt_dir(run_dir, attempt)
                protocol.atomic_write_json(adir / RANK_FAILURE.format(ranks.rank), {
                    "class": cls, "step": step, "rank": ranks.rank, "detail": detail[-1800:], **extra})
            return True
        protocol.write_failure(run_dir, attempt, cls, step, detail, **extra)
        return True
    except OSError as e:
        print(f"[trainer] FAILURE CLASS {cls} (failure.json not written: {e!r})", file=sys.stderr, flush=True)
        return False


def write_run_config(run_dir: Path, cfg: dict[str, Any]) -> None:
    protocol.atomic_write_json(run_dir / protocol.RUN_CONFIG, cfg)


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """The previous attempt's run_config.json, or {} (it is informative, never a guard)."""
    return protocol.read_run_config(run_dir)
