"""Phase 2 of an attempt: build the model and data, check them, restore the checkpoint; then record the config.

The checks here need the data or the model (lesson 2): enough usable text, the vocabulary the model
embeds, a checkpoint whose tensors fit this model. They run before the first step, so a mismatch
costs one load, not a crash mid-run. ``record_run_config`` then records the effective configuration
of this attempt (run_config.json, a contract: its keys are the argparse dest names plus what the
phases found).
"""

from __future__ import annotations

import argparse
import functools
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from orch_trainer import data as datamod
from orch_trainer import runfiles
from orch_trainer.attempt import Attempt
from orch_trainer.config import run_config
from orch_trainer.model import PRESETS, TinyGPT
from orch_trainer.preflight import Preflight
from orch_trainer.ranks import SINGLE, Ranks, shard_model
from orch_trainer.runfiles import log
from orch_trainer.state import optimizer_states
from orchestrator import protocol
from orchestrator.kit.checkpoint import CheckpointCorrupt, CheckpointManager
from orchestrator.kit.rng import restore_rng
from orchestrator.kit.sharded import ShardedCheckpointer, dcp_state, is_sharded, set_dcp_state


@dataclass(frozen=True)
class Loaded:
    """The model and data of this attempt, restored to ``start_step`` completed steps."""

    corpus: datamod.Corpus
    sampler: datamod.BatchSampler
    eval_tokens: torch.Tensor
    model: TinyGPT
    trainable: list[torch.nn.Parameter]  # what the optimizer updates and the gradient clip sees
    optimizer: torch.optim.AdamW
    scheduler: torch.optim.lr_scheduler.LambdaLR
    start_step: int  # completed optimizer steps when training starts (0 on a fresh start)
    resumed_from: int | None  # the checkpoint's step, None on a fresh start
    oom_events: tuple[dict[str, Any], ...]  # the in-process OOM shrinks the restored checkpoint records
    # The loss of step ``start_step`` as its checkpoint recorded it (NaN on a fresh start or an older checkpoint):
    # a resume at the last step trains nothing, and its result still reports the final loss (CI 60 saw None).
    last_loss: float = float("nan")


@dataclass(frozen=True)
class RunConfig:
    """run_config.json as written before the first step; the step loop rewrites it after an OOM shrink."""

    values: dict[str, Any]
    # Every OOM shrink of the run so far: the checkpoint's, plus those of an earlier attempt after its
    # last checkpoint (its run_config.json kept them). Later checkpoints carry them on.
    oom_events: tuple[dict[str, Any], ...]


def lr_factor(warmup_steps: int, max_steps: int, step: int) -> float:
    """Linear warmup, then cosine decay to 10 % at max_steps (LambdaLR counts completed steps)."""
    w, n = warmup_steps, max_steps
    if step < w:
        return (step + 1) / w
    frac = min(1.0, (step - w) / max(1, n - w))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))


def load(args: argparse.Namespace, attempt: Attempt, ckpts: CheckpointManager, pre: Preflight) -> Loaded:
    """Seed, encode the corpus, build model/optimizer/scheduler, restore ``pre.resume_path`` if any.

    A refusal raises ``attempt.fail("invalid", ...)``. Afterwards the global RNGs are those of the
    resumed step (or freshly seeded), so the first step draws what an uninterrupted run would.
    """
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    mcfg = PRESETS[args.preset]
    corpus = datamod.encode_corpus(pre.corpus_raw, pre.corpus_source)
    if corpus.lines_skipped:
        log(f"skipped {corpus.lines_skipped} of {corpus.lines_total} corpus lines "
            f"(first: {corpus.skipped_examples[0]}); `python -m orch_trainer scan-data` lists them all")
    train_tokens, eval_tokens = datamod.split(corpus)
    # Too little usable text: every window would index past the end (an IndexError mid-step).
    if len(eval_tokens) < mcfg.block_size + 1 or len(train_tokens) < mcfg.block_size + 1:
        raise attempt.fail("invalid", None,
                           f"corpus has {len(corpus.tokens)} usable tokens after skipping "
                           f"{corpus.lines_skipped} bad lines; need at least {10 * (mcfg.block_size + 1)}")
    # The model's embedding rows must be the vocabulary the data is encoded with.
    if corpus.vocab_size != mcfg.vocab_size:
        raise attempt.fail("invalid", None,
                           f"vocabulary {corpus.vocab_size} != model vocabulary {mcfg.vocab_size}")
    sampler = datamod.BatchSampler(train_tokens, mcfg.block_size, args.seed)
    model = TinyGPT(mcfg, args.lora_rank).to(pre.device)
    if args.fsdp:
        shard_model(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.01)
    # A partial, not a closure: LambdaLR's state dict keeps a callable object's (empty) __dict__, as
    # checkpoints written before this module existed do; a closure would be saved as None.
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, functools.partial(lr_factor, args.warmup_steps, args.max_steps))
    start_step, resumed_from, oom_events, last_loss = 0, None, (), float("nan")
    if pre.resume_path is not None:
        meta = _restore(args, attempt, ckpts, pre.resume_path, model, optimizer, scheduler)
        start_step, oom_events = int(meta["step"]), tuple(meta.get("oom_events") or [])
        resumed_from = start_step
        loss = protocol.finite_number(meta.get("loss"))
        last_loss = float("nan") if loss is None else loss
    return Loaded(corpus=corpus, sampler=sampler, eval_tokens=eval_tokens, model=model, trainable=trainable,
                  optimizer=optimizer, scheduler=scheduler, start_step=start_step, resumed_from=resumed_from,
                  oom_events=oom_events, last_loss=last_loss)


def _restore(args: argparse.Namespace, attempt: Attempt, ckpts: CheckpointManager, path: Path,
             model: TinyGPT, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR,
             ) -> dict[str, Any]:
    """Load ``path`` (sha256-verified first) into the objects and the global RNGs; its meta.json."""
    if args.fsdp:
        return _restore_sharded(attempt, path, model, optimizer, scheduler)
    try:
        if is_sharded(path):
            # A commit of several ranks (rank 0 verified every file when it chose it): the replicated state, and
            # this rank's RNG only on the world size that saved it (kit.sharded).
            state = ShardedCheckpointer(attempt.run_dir).load(path, map_location="cpu")
        else:
            state = ckpts.load(path, map_location="cpu")
    except CheckpointCorrupt as e:
        raise attempt.fail("invalid", None, f"cannot load {path.name}: {e}") from None
    meta = state["meta.json"]
    # Same shapes or refuse: a checkpoint of another preset or LoRA rank would fail inside
    # load_state_dict with a 40-line message, or worse, half-load.
    if meta.get("vocab") != datamod.VOCAB:
        raise attempt.fail("invalid", None, f"{path.name} was trained with another vocabulary")
    try:
        model.load_state_dict(state["model.pt"])
        optimizer_state, scheduler_state = optimizer_states(state)
        optimizer.load_state_dict(optimizer_state)
        scheduler.load_state_dict(scheduler_state)
    except (RuntimeError, ValueError, KeyError) as e:
        raise attempt.fail("invalid", None,
                           f"{path.name} does not fit this model (preset {args.preset}, "
                           f"lora rank {args.lora_rank}): {str(e)[:500]}") from None
    if "rng.pt" in state:
        restore_rng(state["rng.pt"])
    else:  # saved on another world size: each rank keeps the RNG it was seeded with
        log(f"{path.name} was saved on {meta.get('world_size')} ranks: per-rank RNG states not restored")
    log(f"resumed from {path.name} (step {int(meta['step'])})")
    return meta


def _restore_sharded(attempt: Attempt, path: Path, model: TinyGPT, optimizer: torch.optim.Optimizer,
                     scheduler: torch.optim.lr_scheduler.LambdaLR) -> dict[str, Any]:
    """--fsdp: model and optimizer through DCP into this rank's shards (the kit's helpers, as orch_run's), the
    scheduler and meta from rank 0's files, this rank's RNG on the same world size."""
    template = dcp_state(model, optimizer)
    try:
        state = ShardedCheckpointer(attempt.run_dir).load(path, sharded=template, map_location="cpu")
        set_dcp_state(model, optimizer, template)
        scheduler.load_state_dict(state["sched.pt"])
    except (CheckpointCorrupt, RuntimeError, ValueError, KeyError) as e:
        raise attempt.fail("invalid", None, f"cannot load {path.name} into the sharded model: {str(e)[:500]}") from None
    meta = state["meta.json"]
    if "rng.pt" in state:
        restore_rng(state["rng.pt"])
    else:
        log(f"{path.name} was saved on {meta.get('world_size')} ranks: per-rank RNG states not restored")
    log(f"resumed from {path.name} (step {meta['step']})")
    return meta


def record_run_config(args: argparse.Namespace, attempt: Attempt, pre: Preflight, loaded: Loaded,
                     ranks: Ranks = SINGLE) -> RunConfig:
    """Write run_config.json (the effective configuration of this attempt; rank 0's alone) and return what it
    holds."""
    cfg = run_config(args)
    prev = runfiles.read_run_config(attempt.run_dir) if loaded.resumed_from is not None else {}
    oom_events = list(loaded.oom_events)
    known = {(e.get("attempt"), e.get("step")) for e in oom_events if isinstance(e, dict)}
    for e in prev.get("oom_events") or []:  # events after the last checkpoint of an earlier attempt
        if isinstance(e, dict) and (e.get("attempt"), e.get("step")) not in known:
            oom_events.append(e)
    cfg.update(
        run_dir=str(attempt.run_dir), micro_batch_size=pre.micro, resumed_from_step=loaded.resumed_from,
        resumed_from=attempt.display_path(pre.resume_path),
        data_sha256=pre.data_sha256, data_source=pre.corpus_source,
        data_lines_total=loaded.corpus.lines_total, data_lines_skipped=loaded.corpus.lines_skipped,
        skipped_checkpoints=list(pre.skipped_checkpoints), oom_events=oom_events,
        accumulation_steps=pre.accum, device=pre.device.type, device_requested=args.device,
        attempt=attempt.n, job=attempt.job, model=PRESETS[args.preset].to_dict(),
    )
    if ranks.multi:
        cfg.update(world_size=ranks.world)  # accumulation_steps is then per rank
    if ranks.is_writer:
        runfiles.write_run_config(attempt.run_dir, cfg)
    return RunConfig(values=cfg, oom_events=tuple(oom_events))
