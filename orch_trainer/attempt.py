"""One attempt of one run, as every phase of the trainer sees it: where it writes, how it reports.

Each phase (``preflight`` -> ``load`` -> the step loop -> ``finish``) reports a failure the same way:
``raise attempt.fail(cls, step, detail)`` writes ``attempts/<n>/failure.json`` and unwinds to
``Trainer.run``, which returns the exit code. So a phase never needs the ``Trainer`` itself, only this
small frozen value.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orch_trainer import runfiles
from orch_trainer.trainerexit import TrainerExit
from orchestrator import protocol

if TYPE_CHECKING:
    from orchestrator.kit.checkpoint import CheckpointError

@dataclass(frozen=True)
class Attempt:
    """The run dir, the attempt number ``n`` (from 1) and the job name of the running attempt."""

    run_dir: Path
    n: int
    job: str

    def fail(self, cls: str, step: int | None, detail: str, code: int = protocol.EXIT_FAILURE_REPORTED,
             **extra: Any) -> TrainerExit:
        """Write failure.json (or say the class on stderr if even that fails); the caller raises the result."""
        runfiles.report_failure(self.run_dir, self.n, cls, step, detail, **extra)
        return TrainerExit(code)

    def save_failed(self, e: CheckpointError) -> TrainerExit:
        """Classify a failed checkpoint save: a full disk is ``enospc`` (retryable once space is freed), an I/O
        error of the storage ``storage`` (retried after a back-off; the previous checkpoint is the resume point)."""
        cause = e.cause
        free = shutil.disk_usage(self.run_dir).free
        cls = protocol.write_error_class(cause)
        if cls == "enospc":
            return self.fail("enospc", e.step, f"checkpoint step {e.step} did not fit: {cause}; "
                             f"previous checkpoints are intact", bytes_needed=e.bytes_needed, bytes_free=free)
        if cls == "storage":
            return self.fail("storage", e.step, f"checkpoint step {e.step} failed on the storage: {cause}; "
                             "previous checkpoints are intact (the resume point)", bytes_free=free)
        return self.fail("crash", e.step, f"checkpoint step {e.step} failed: {cause!r}; "
                         "previous checkpoints intact", bytes_free=free)

    def display_path(self, path: Path | None) -> str | None:
        """Relative to the run dir when inside it (how failure.json names checkpoints), else absolute."""
        if path is None:
            return None
        return str(path.relative_to(self.run_dir)) if self._inside(path) else str(path)

    def _inside(self, path: Path | None) -> bool:
        return path is not None and path.resolve().is_relative_to(self.run_dir.resolve())
