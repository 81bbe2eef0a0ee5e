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


# sbatch options a multi-rank job's layout owns: sbatch takes the last --nodes (and getopt prefixes: --nod=2), so srun
# would use the nodes orch asked for while the allocation held others, idle.
RANK_SBATCH_OPTIONS = ("nodes", "ntasks", "ntasks-per-node", "gpus-per-node")


def rank_option_taken(sbatch_args: Any) -> str | None:
    """The first of ``sbatch_args`` that names an option of the rank layout (``RANK_SBATCH_OPTIONS``), or None."""
    for arg in sbatch_args or ():
        opt = str(arg)[2:].split("=", 1)[0].lower()
        if opt and any(owned.startswith(opt) for owned in RANK_SBATCH_OPTIONS):
            return str(arg)
    return None


def reshape_refusal(resources: dict[str, Any], nodes: int | None, nproc_per_node: int | None,
                    multi_node: bool) -> str | None:
    """Why a job of these stored ``resources`` cannot run its next attempt on ``nodes`` x ``nproc_per_node``
    ranks (None: it can). The rules of ``orch submit``'s --nodes/--nproc-per-node, against what the job has."""
    nproc = nproc_per_node if nproc_per_node is not None else resources.get("nproc_per_node")
    if nodes is not None and nproc is None:
        return ("--nodes needs --nproc-per-node: the job runs its program as given, not as ranks (give "
                "--nproc-per-node too)")
    if (nodes or 1) > 1 and not multi_node:
        return f"--nodes {nodes}: its backend runs a job on one machine only"
    taken = rank_option_taken(dict(resources_of(resources).extras).get("extra_sbatch")) if nproc is not None else None
    if taken is not None:
        return f"its --sbatch-arg {taken!r} sets what the rank layout sets (submit it again without it)"
    return None


def reshaped(resources: dict[str, Any], nodes: int | None, nproc_per_node: int | None) -> dict[str, Any]:
    """``resources`` with the rank layout changed (a job that ran as given becomes 1 node unless told)."""
    out = dict(resources)
    if nproc_per_node is not None:
        out["nproc_per_node"] = nproc_per_node
        out.setdefault("nodes", 1)
    if nodes is not None:
        out["nodes"] = nodes
        if (out.get("min_nodes") or 0) >= nodes:  # fewer nodes than it now asks for: never below the new count
            out.pop("min_nodes")
    return out


def layout_text(resources: dict[str, Any]) -> str:
    """``2 nodes x 2 ranks``, ``1 node x 4 ranks``, or ``the program as given``."""
    nproc, nodes = resources.get("nproc_per_node"), resources.get("nodes") or 1
    if not nproc:
        return "the program as given"
    return f"{nodes} node{'s' if nodes != 1 else ''} x {nproc} rank{'s' if nproc != 1 else ''}"


def resources_dict(r: Resources) -> dict[str, Any]:
    """The set fields of ``r``, shaped as the job row stores them (what command.json records)."""
    out: dict[str, Any] = {k: getattr(r, k) for k in GENERIC if getattr(r, k) is not None}
    if r.extras:
        out[EXTRAS_KEY] = {k: list(v) if isinstance(v, tuple) else v for k, v in r.extras}
    return out
