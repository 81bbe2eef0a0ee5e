"""Where Slurm writes a job's files inside orch's runs root, and what the reconciler reads back from them.

A single attempt's output goes to ``attempts/<n>/slurm/``; an array's script, task table and output to
``<runs root>/.orch-batches/<token>/``. Reading the output's tail is how a cluster with
``JobAcctGatherParams=OverMemoryKill`` (sacct says only ``FAILED 0:9``) is still classified ``oom``.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.backends.base import AttemptRef
from orchestrator.backends.slurm import states as slurm_states
from orchestrator.backends.slurm.sbatch import (
    ARRAY_OUTPUT_PATTERN,
    BATCHES_DIR,
    OUTPUT_PATTERN,
    OUTPUT_TAIL_BYTES,
    SLURM_DIR,
)


def slurm_output_path(ref: AttemptRef, job_id: str) -> Path:
    """Where Slurm writes the job's output: the attempt's slurm/ dir, or an array's batch dir."""
    if ref.batch and "_" in job_id:
        a, _, t = job_id.partition("_")
        return batch_dir_of(ref.run_dir, ref.batch) / ARRAY_OUTPUT_PATTERN.replace("%A", a).replace("%a", t)
    return ref.attempt_dir / SLURM_DIR / OUTPUT_PATTERN.replace("%j", str(job_id))


def over_memory_line(ref: AttemptRef, job_id: str) -> str | None:
    """slurmstepd's "exceeded memory limit" line from the tail of the job's Slurm output, if any."""
    path = slurm_output_path(ref, job_id)
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - OUTPUT_TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = tail.splitlines()
    for marker in slurm_states.OVER_MEMORY_MARKERS:  # the first marker's line carries the numbers
        for line in reversed(lines):
            if marker in line.lower():
                return line.strip()
    return None


def batch_dir_of(run_dir: Path, batch_token: str) -> Path:
    """``<runs root>/.orch-batches/<token>``: an array's script, task table and Slurm output files.

    Inside the runs root (orch writes nowhere else) and never a job's name (those start with a letter
    or digit).
    """
    return run_dir.parent / BATCHES_DIR / batch_token
