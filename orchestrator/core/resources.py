"""What a job asks of its backend, generic across backends, and the bounds every entry point checks it against.

The CLI (``orch submit``/``orch sweep``), ``orch.toml`` and the Python API (``orchestrator.ops.executor``) all
build a ``Resources`` through the same bounds, so a value one of them accepts is never refused by another
after the job row exists.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from orchestrator.backends.base import Resources

MAX_MEM_MB = 2**43  # its size in bytes still fits a signed 64-bit integer (Slurm, the DB)
MAX_TIME_S = (2**32 - 2) * 60  # Slurm keeps a time limit in minutes in a uint32 (all ones = INFINITE)


EXTRAS_KEY = "extras"  # the job row's resources JSON: backend-specific options under this key
# Rows written by older versions kept the Slurm backend's options at the top level of the resources JSON.
LEGACY_EXTRAS = ("partition", "account", "extra_sbatch")
GENERIC = tuple(f.name for f in fields(Resources) if f.name != "extras")


def resources_of(r: dict[str, Any]) -> Resources:
    """The job row's ``resources`` JSON (of any orch version) as the typed value a backend takes."""
    legacy = {k: r[k] for k in LEGACY_EXTRAS if r.get(k) not in (None, [], ())}
    extras = r.get(EXTRAS_KEY)
    extras = {**legacy, **(extras if isinstance(extras, dict) else {})}
    return Resources(**{k: r.get(k) for k in GENERIC}, extras=extras)


def partition_of(r: Any) -> str | None:
    """The partition a job row's resources JSON names: under ``extras``, at the top level in older rows.
    Goodput's grouping and the MTBF's history read it; both read the top level only, so every job written since
    older versions counted as partition "-" (found by `orch report` over the dev cluster's real preemption trials)."""
    if not isinstance(r, dict):
        return None
    extras = r.get(EXTRAS_KEY)
    part = extras.get("partition") if isinstance(extras, dict) else None
    part = part if part is not None else r.get("partition")
    return part if isinstance(part, str) and part else None


def resources_dict(r: Resources) -> dict[str, Any]:
    """The set fields of ``r``, shaped as the job row stores them (what command.json records)."""
    out: dict[str, Any] = {k: getattr(r, k) for k in GENERIC if getattr(r, k) is not None}
    if r.extras:
        out[EXTRAS_KEY] = {k: list(v) if isinstance(v, tuple) else v for k, v in r.extras}
    return out
