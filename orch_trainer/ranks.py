"""Several ranks of the bundled trainer: who writes, the process group, one decision for all.

Under torchrun (``orch submit --nproc-per-node K``) every rank runs the same attempt. The multi-rank parts are
the kit's (``orchestrator.kit.dist``: StopAgreement, grad_accumulation, barrier, settle;
``orchestrator.kit.sharded.ShardedCheckpointer``: every rank writes its own files, rank 0 the manifest last);
this module only wires them to the trainer's phases:

* rank 0 alone writes the run-level files (program.json, run_config.json, failure.json, result/, done.json or
  the completion record, progress.json) and alone renames checkpoints aside; another rank writes only its
  heartbeat file, its part of each commit, and ``failure.rank-<r>.json`` when it fails on its own;
* a decision that has side effects on the run dir (which checkpoint to resume, the result) is taken by rank 0
  and broadcast (:meth:`Ranks.rank0_decides`), so no rank acts on a choice another did not make.

One process (no WORLD_SIZE, or 1) is :data:`SINGLE`: every call below is then the plain single-process path.
Importing this module does not import torch (``__main__`` uses it before torch is loaded).
"""

from __future__ import annotations

import argparse
import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from orch_trainer.trainerexit import TrainerExit

T = TypeVar("T")

# A collective that waits for a dead or hung peer fails after this long (gloo's own default is 30 minutes).
ENV_COLLECTIVE_TIMEOUT_S = "ORCH_TRAINER_COLLECTIVE_TIMEOUT_S"
DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0


class RankDecisionFailed(RuntimeError):
    """Rank 0 raised while deciding for every rank; the other ranks raise this (rank 0 reports its own error)."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job: global ``rank``, ``world`` size and ``local_rank`` (its GPU)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def multi(self) -> bool:
        return self.world > 1

    @property
    def is_writer(self) -> bool:
        """Global rank 0 writes the run-level files; with one process, that process."""
        return self.rank == 0

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Ranks:
        """torchrun's RANK / WORLD_SIZE / LOCAL_RANK; values that are not integers read as one process here and
        are refused by :func:`refusal` (the attempt then fails ``invalid``, before any collective)."""
        env = os.environ if environ is None else environ
        world = _int(env.get("WORLD_SIZE"), 1)
        if world <= 1:
            return SINGLE
        return cls(rank=_int(env.get("RANK"), 0), world=world, local_rank=_int(env.get("LOCAL_RANK"), 0))

    # --- one decision for all ranks ----------------------------------------------------------------
    def rank0_decides(self, decide: Callable[[], T]) -> T:
        """``decide()`` on rank 0 only, its result on every rank; one process: just ``decide()``.

        A refusal on rank 0 (``TrainerExit``, already reported there) ends every rank with the same exit code and
        nothing written by the others; any other error on rank 0 ends the others with
        :class:`RankDecisionFailed`, never a wait in a collective rank 0 will not join.
        """
        if not self.multi:
            return decide()
        box: list[Any] = [None]
        error: BaseException | None = None
        if self.is_writer:
            try:
                box[0] = ("ok", decide())
            except TrainerExit as e:
                box[0], error = ("exit", e.code), e
            except Exception as e:
                box[0], error = ("error", repr(e)[:500]), e
        _dist().broadcast_object_list(box, src=0)
        if error is not None:
            raise error
        kind, value = box[0]
        if kind == "exit":
            raise TrainerExit(value)
        if kind == "error":
            raise RankDecisionFailed(f"rank 0 failed: {value}")
        return value


SINGLE = Ranks()


def _int(raw: str | None, default: int) -> int:
    return int(raw) if raw is not None and raw.strip().isdigit() else default


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def refusal(args: argparse.Namespace, environ: dict[str, str] | None = None) -> str | None:
    """Why this combination cannot run as several ranks (one line), or None. Arguments and environment only: it
    runs before the process group exists, so every rank refuses alike and none waits for another."""
    env = os.environ if environ is None else environ
    raw_world = env.get("WORLD_SIZE", "1").strip() or "1"
    if not raw_world.isdigit() or int(raw_world) < 1:
        return f"WORLD_SIZE={raw_world[:16]!r} is not a positive integer"
    world = int(raw_world)
    if world == 1:
        fsdp = getattr(args, "fsdp", False)
        return "--fsdp shards over several ranks: start it with orch submit --nproc-per-node K" if fsdp else None
    for key in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if not env.get(key, "").strip():
            return f"WORLD_SIZE={world} without {key}: start the ranks with torchrun (orch submit --nproc-per-node)"
    if not env["RANK"].isdigit() or int(env["RANK"]) >= world:
        return f"RANK={env['RANK'][:16]!r} is not a rank of WORLD_SIZE={world}"
    # Each fault fires once per run dir, recorded in one file: several ranks would race on it and fire it on
    # one rank only (a SIGTERM fault is then a one-rank stop, a NaN fault a one-rank blow-up).
    if args.inject_fault:
        return f"--inject-fault is not supported with WORLD_SIZE={world} (it is a one-process drill)"
    from orchestrator.kit.dist import grad_accumulation

    try:
        grad_accumulation(args.batch_size, args.micro_batch_size, world)
    except ValueError as e:
        return (f"--batch-size is the global batch: {e}; give a --batch-size that {world} ranks divide, or a "
                f"--micro-batch-size M with M x {world} dividing it")
    return None


def collective_timeout_s(environ: dict[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    try:
        v = float(env.get(ENV_COLLECTIVE_TIMEOUT_S, "") or DEFAULT_COLLECTIVE_TIMEOUT_S)
    except ValueError:
        return DEFAULT_COLLECTIVE_TIMEOUT_S
    return v if v > 0 else DEFAULT_COLLECTIVE_TIMEOUT_S


def init_group(ranks: Ranks, cuda: bool) -> None:
    """The process group: nccl on CUDA (this rank's GPU is ``LOCAL_RANK``), gloo on CPU; every collective is
    bounded (a peer killed -9 must not leave the others waiting for gloo's 30 minutes)."""
    import torch

    from orchestrator.kit.heartbeat import arm_from_env

    arm_from_env()  # before the group forms: a rank that never gets past it is judged hung
    if cuda:
        torch.cuda.set_device(ranks.local_rank)
    _dist().init_process_group("nccl" if cuda else "gloo", rank=ranks.rank, world_size=ranks.world,
                               timeout=datetime.timedelta(seconds=collective_timeout_s()))


def shard_model(model: Any) -> None:
    """FSDP2: each transformer block is one unit of shards (gathered for its forward/backward), the rest the root's.
    Before the optimizer exists: it must hold the sharded parameters."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)


def leave(ranks: Ranks) -> None:
    """Tear the group down once the kit's collectives are let go (a tensor freed during interpreter
    finalization aborts the rank: kit.dist.settle)."""
    if not ranks.multi:
        return
    from orchestrator.kit.dist import settle

    settle()
    dist = _dist()
    if dist.is_initialized():
        dist.destroy_process_group()
