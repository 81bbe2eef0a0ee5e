"""What a job asks of its backend, generic across backends, and the bounds every entry point checks it against.

The CLI (``orch submit``/``orch sweep``), ``orch.toml`` and the Python API (``orchestrator.executor``) all
build a ``Resources`` through the same bounds, so a value one of them accepts is never refused by another
after the job row exists.
"""

from __future__ import annotations

from typing import Any

from orchestrator.backends.base import Resources

MAX_MEM_MB = 2**43  # its size in bytes still fits a signed 64-bit integer (Slurm, the DB)
MAX_TIME_S = (2**32 - 2) * 60  # Slurm keeps a time limit in minutes in a uint32 (all ones = INFINITE)


def resources_of(r: dict[str, Any]) -> Resources:
    """The job row's ``resources`` JSON as the typed value a backend takes."""
    return Resources(partition=r.get("partition"), gpus=r.get("gpus"), cpus_per_task=r.get("cpus_per_task"),
                     mem_mb=r.get("mem_mb"), time_s=r.get("time_s"), account=r.get("account"),
                     extra_sbatch=tuple(r.get("extra_sbatch") or ()), nodes=r.get("nodes"),
                     nproc_per_node=r.get("nproc_per_node"), gpus_per_node=r.get("gpus_per_node"))


def resources_dict(r: Resources) -> dict[str, Any]:
    """The set fields of ``r`` (what command.json records)."""
    return {k: v for k, v in r.__dict__.items() if v not in (None, ())}
