"""Why did an attempt end without a verified marker?  (backend outcome, report, exit) -> class.

The job's own report (``attempts/<n>/failure.json``) wins: the trainer knows it hit NaN at step
412. Without one, the scheduler's word (Slurm's OUT_OF_MEMORY, PREEMPTED, ...) decides; without
that, the exit code. Pure function: no I/O, no DB, unit-tested on every row.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass

from orchestrator.backends.base import Outcome, Phase
from orchestrator.protocol import EXIT_PREEMPTED, MarkerStatus, Verification

# Slurm job states (sacct) that say why a job ended, whatever its exit code.
SLURM_STATE_CLASS = {
    "PREEMPTED": "preempted",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "OUT_OF_MEMORY": "oom",
    "NODE_FAIL": "node_fail",
    "BOOT_FAIL": "node_fail",
    "CANCELLED": "cancelled",
}


@dataclass(frozen=True)
class Classification:
    cls: str
    step: int | None
    detail: str


def classify(outcome: Outcome, report: dict | None, verification: Verification,
             preset: str | None = None) -> Classification:
    """Class of an attempt that ended (EXITED or VANISHED) and whose marker does not verify.

    ``preset`` is a class the reconciler decided while the job ran (``hang``: it stopped the job
    because its heartbeat stalled).
    """
    state = (outcome.backend_state or "").split()[0].upper() if outcome.backend_state else ""
    if preset and (report is None or report["class"] == "preempted"):
        # orch itself stopped it (hang): the SIGTERM the job then reports as "preempted" was ours,
        # and a free uncounted resume would hide a job that hangs every time.
        return Classification(preset, (report or {}).get("step"), "stopped by the reconciler: no heartbeat")
    if report is not None:
        cls = report["class"]
        if cls == "preempted" and state == "CANCELLED":
            cls = "cancelled"  # someone ran scancel: not a free, automatic resume
        if cls == "preempted" and state in ("TIMEOUT", "DEADLINE"):
            # The job checkpointed on the warning signal and called it preemption; the scheduler
            # knows the signal came from the time limit.
            cls = "timeout"
        return Classification(cls, report.get("step"), str(report.get("detail", ""))[:500])
    if state in SLURM_STATE_CLASS:
        detail = f"scheduler state {outcome.backend_state}" + (f"; {outcome.reason}" if outcome.reason else "")
        return Classification(SLURM_STATE_CLASS[state], None, detail)
    if "exceeded" in outcome.reason.lower() and "memory" in outcome.reason.lower():
        # Slurm without cgroups (OverMemoryKill): FAILED 0:9 plus this line in the job's output.
        return Classification("oom", None, outcome.reason[:500])
    if outcome.phase is Phase.VANISHED:
        return Classification("unknown", None, outcome.reason or "process vanished without an exit record")
    rc, sig = outcome.exit_code, outcome.signal
    if rc == 0 and not sig:
        if verification.status is MarkerStatus.CORRUPT:
            return Classification("marker_corrupt", None, f"exit 0 but marker {verification.reason}")
        why = outcome.reason or "exit 0 without a done marker"
        return Classification("marker_missing", None, why)
    if sig == _signal.SIGTERM or rc == EXIT_PREEMPTED:
        return Classification("preempted", None, "terminated by SIGTERM without a report")
    if sig == _signal.SIGKILL or rc == 128 + _signal.SIGKILL:
        return Classification("crash", None, "killed by SIGKILL (kill -9 or the kernel OOM killer)")
    if rc == 2:
        # argparse and most CLIs exit 2 on a usage error: retrying the same argv cannot help.
        return Classification("invalid", None, "exit 2 (usage error)")
    if sig:
        return Classification("crash", None, f"killed by signal {sig}")
    return Classification("crash", None, f"exit {rc}")
