"""What a checkpoint holds (model, optimizer, scheduler, RNG, meta) and what the heartbeat reports.

Bit-exact resume rests on two things here: the RNG is captured with the weights (dropout masks after a
resume are those of an uninterrupted run), and ``meta.json`` records how the state was made (effective
and micro batch, data sha256, OOM shrinks) so that the next attempt's preflight can refuse or adapt
before it loads anything.
"""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from orch_trainer import data as datamod
from orch_trainer.model import PRESETS
from orchestrator import protocol


def autocast(device: torch.device) -> AbstractContextManager[Any]:
    """bf16 autocast on CUDA, nothing on CPU; the same for training steps and the final eval."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def checkpoint_meta(args: argparse.Namespace, *, step: int, micro: int, accum: int, data_sha256: str,
                    oom_events: Sequence[dict[str, Any]], attempt: int, world: int = 1,
                    loss: float = float("nan")) -> dict[str, Any]:
    """meta.json: what the next attempt's preflight compares before loading (batch, data, OOM shrinks), and the
    loss of ``step`` (a resume at the last step reports it as the final loss). Several ranks: ``world_size`` too
    (``accumulation_steps`` is then per rank)."""
    sharded = {"fsdp": True} if getattr(args, "fsdp", False) else {}
    return {**({"world_size": world} if world > 1 else {}), **sharded, "step": step, "batch_size": args.batch_size,
            "micro_batch_size": micro, "accumulation_steps": accum, "skip_batches": args.skip_batches,
            "seed": args.seed,
            "data_sha256": data_sha256, "preset": args.preset, "lora_rank": args.lora_rank,
            "model": PRESETS[args.preset].to_dict(), "vocab": datamod.VOCAB, "oom_events": list(oom_events),
            "loss": loss if math.isfinite(loss) else None, "attempt": attempt, "saved_at": protocol.now_iso()}


def state_files(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                scheduler: torch.optim.lr_scheduler.LRScheduler, rng: dict[str, Any],
                meta: dict[str, Any]) -> dict[str, Any]:
    """The files of one checkpoint, in the order they are written (``CheckpointManager.save``'s input): the kit's
    layout, as ``orchestrator.integrations.loop`` writes it and the sharded save already did (``sched.pt`` beside
    ``optim.pt``); ``rng`` is ``orchestrator.kit.rng.capture_rng``'s."""
    return {"model.pt": model.state_dict(), "optim.pt": optimizer.state_dict(), "sched.pt": scheduler.state_dict(),
            "rng.pt": rng, "meta.json": meta}


def optimizer_states(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(optimizer, scheduler) states of a loaded checkpoint. Before the trainer used the kit's layout it nested
    both in ``optim.pt`` (``{"optimizer": ..., "scheduler": ...}``, no ``sched.pt``): its older checkpoints resume."""
    if "sched.pt" in state:
        return state["optim.pt"], state["sched.pt"]
    return state["optim.pt"]["optimizer"], state["optim.pt"]["scheduler"]


def progress_fields(args: argparse.Namespace, *, step: int, last_loss: float, tok_s: float | None,
                    tokens_per_step: int, resumed_from: int, saving: int | None = None) -> dict[str, Any]:
    """What ``attempts/<n>/progress.json`` says: the last completed step, how fast the run goes, and
    the step this attempt started from (``orch metrics`` counts the steps a preemption made it redo)."""
    fields = {"step": step, "loss": last_loss if math.isfinite(last_loss) else None,
              "tokens_per_s": tok_s, "max_steps": args.max_steps, "tokens_per_step": tokens_per_step,
              "resumed_from": resumed_from}
    if saving is not None:
        fields["saved_step"] = saving
    return fields
