"""Phase 1 of an attempt: the filesystem checks, before the model exists (lesson 2, seed 000).

The caller has already done the argument checks (``trainer.config``) and the "already complete" check
(``trainer.__main__``). What runs here needs only files: the corpus is readable, which checkpoint to
resume and whether its batch and data match this run, whether the disk has room for the checkpoints
and the result. Each refusal costs seconds here instead of a model load (or an hour of training) later.
Only manifests and ``meta.json`` files are read; no tensor is loaded.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from orch_trainer import data as datamod
from orch_trainer.attempt import Attempt
from orch_trainer.model import PRESETS, checkpoint_bytes_estimate
from orch_trainer.ranks import SINGLE, Ranks
from orch_trainer.runfiles import log
from orchestrator import protocol
from orchestrator.kit.checkpoint import CheckpointManager
from orchestrator.kit.dist import grad_accumulation

# An input that is not there (ENOENT) or whose NFS handle went stale (ESTALE): maybe back in a moment.
MISSING_ERRNOS = frozenset({errno.ENOENT, errno.ESTALE})


@dataclass(frozen=True)
class Preflight:
    """What the filesystem checks found; ``load`` builds the model from it."""

    corpus_raw: bytes
    corpus_source: str
    data_sha256: str
    device: torch.device
    resume_path: Path | None  # the checkpoint to resume (None: a fresh start)
    resume_meta: dict[str, Any] | None  # its meta.json
    skipped_checkpoints: tuple[dict[str, str], ...]  # corrupt ones set aside on the way, for run_config.json
    micro: int  # micro-batch size: the argument's, or the smaller one a resumed run shrank to after an OOM
    accum: int  # micro-batches per optimizer step on each rank (batch_size // (micro * world size))


def preflight(args: argparse.Namespace, attempt: Attempt, ckpts: CheckpointManager,
              ranks: Ranks = SINGLE) -> Preflight:
    """Run the filesystem checks in order; a refusal raises ``attempt.fail(...)`` (nothing loaded yet).

    Side effects, all on the run dir: stale tmp dirs of a crashed writer are removed, corrupt
    checkpoints and those newer than an explicit resume point are renamed aside.
    """
    # Several ranks share one run dir: rank 0 alone cleans, renames aside and decides (hostile test: two ranks
    # that each did crashed at random on "Directory not empty"); the others read what it decided.
    if ranks.is_writer:
        ckpts.clean_stale()
    # Unreadable corpus: refuse now, not after the model is built (and not as a crash later).
    try:
        raw, source = datamod.read_corpus_bytes(args.data)
    except OSError as e:
        if e.errno in MISSING_ERRNOS:
            # Missing may be transient (an NFS hiccup during a resume): orch retries it with back-off and
            # calls it invalid only when it repeats (one observation made the job failed for good).
            raise attempt.fail("input_missing", None, f"corpus {args.data} missing: {e}",
                               path=str(args.data)) from None
        raise attempt.fail("invalid", None, f"corpus {args.data} unreadable: {e}") from None
    data_sha256 = hashlib.sha256(raw).hexdigest()
    device = _pick_device(args, attempt, ranks)
    resume_path, resume_meta, skipped, micro, accum = ranks.rank0_decides(
        lambda: _resume_point(args, attempt, ckpts, data_sha256))
    if ranks.multi:
        accum = _accumulation_per_rank(args, attempt, micro, ranks.world)
    if ranks.is_writer:
        _check_free_space(args, attempt)
    return Preflight(corpus_raw=raw, corpus_source=source, data_sha256=data_sha256, device=device,
                     resume_path=resume_path, resume_meta=resume_meta, skipped_checkpoints=tuple(skipped),
                     micro=micro, accum=accum)


def _resume_point(args: argparse.Namespace, attempt: Attempt, ckpts: CheckpointManager, data_sha256: str,
                  ) -> tuple[Path | None, dict[str, Any] | None, list[dict[str, str]], int, int]:
    """(checkpoint, its meta, corrupt ones set aside, micro, accum): rank 0's choice, with its side effects."""
    skipped: list[dict[str, str]] = []
    resume_path, resume_meta = _select_checkpoint(args, attempt, ckpts, skipped)
    micro, accum = args.micro_batch_size, args.batch_size // args.micro_batch_size
    if resume_path is not None and resume_meta is not None:
        micro, accum = _check_resume_compatible(args, attempt, resume_path, resume_meta, data_sha256, micro, accum)
    return resume_path, resume_meta, skipped, micro, accum


def _accumulation_per_rank(args: argparse.Namespace, attempt: Attempt, micro: int, world: int) -> int:
    """Micro-batches per step on each rank: --batch-size is the global batch on any world size."""
    try:
        return grad_accumulation(args.batch_size, micro, world)
    except ValueError as e:  # a micro-batch a one-rank OOM shrank to that does not split over these ranks
        raise attempt.fail("invalid", None, f"--batch-size is the global batch: {e}") from None


def pick_device(args: argparse.Namespace, ranks: Ranks = SINGLE) -> torch.device:
    """CUDA when asked or available (this rank's GPU, LOCAL_RANK, under several ranks), else CPU."""
    if args.device == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", ranks.local_rank) if ranks.multi else torch.device("cuda")


def _pick_device(args: argparse.Namespace, attempt: Attempt, ranks: Ranks) -> torch.device:
    if args.device == "cuda" and not torch.cuda.is_available():
        # Falling back to CPU would turn a 1-hour GPU job into a 3-day CPU job without a word.
        raise attempt.fail("invalid", None, "--device cuda but no CUDA device is available")
    return pick_device(args, ranks)


def _select_checkpoint(args: argparse.Namespace, attempt: Attempt, ckpts: CheckpointManager,
                       skipped: list[dict[str, str]]) -> tuple[Path | None, dict[str, Any] | None]:
    """Pick the checkpoint to resume (reading only manifests and meta.json); corrupt ones go to ``skipped``."""
    if args.resume == "none":
        _set_aside_newer_than(attempt, ckpts, -1)
        return None, None
    if args.resume == "auto":
        def report(path: Path, why: str) -> None:
            # A corrupt newest checkpoint is the kill -9 case of seed 002: skip it, say so, and
            # rename it so the same step can be written again and it is never picked later.
            log(f"skipping corrupt checkpoint {path.name}: {why}")
            skipped.append({"name": path.name, "reason": why})
            ckpts.set_aside(path, "corrupt")
        found = ckpts.latest_verified(on_corrupt=report)
        return (found[1], _read_meta(attempt, found[1])) if found else (None, None)
    path = Path(args.resume)
    if not path.is_absolute() and ((attempt.run_dir / path).exists() or path.parts[:1] == (protocol.CHECKPOINTS_DIR,)):
        path = attempt.run_dir / path  # failure.json and orch's policy name checkpoints relative to the run dir
    problem = protocol.verify_checkpoint(path)
    own = path.parent.resolve() == ckpts.root.resolve()
    if problem is not None and own and protocol.checkpoint_step(path) is not None:
        # A rollback target corrupted after orch's policy verified it (the attempt was invalid and
        # the job failed for good): set it aside and resume from the next OLDER verified one, never a newer
        # one (a rollback must not resume past the bad step); none left: a fresh start.
        log(f"--resume {args.resume} does not verify ({problem}): set aside; resuming from an older checkpoint")
        skipped.append({"name": path.name, "reason": problem})
        step = protocol.checkpoint_step(path) or 0
        if path.is_dir():  # a target gone altogether is a problem too: fall back the same way
            ckpts.set_aside(path, "corrupt")
        older = _newest_verified_before(ckpts, step, skipped)
        if older is None:
            _set_aside_newer_than(attempt, ckpts, -1)
            return None, None
        path, problem = older, None
    if problem is not None:
        # A path outside this run's checkpoints/ (another run's fork): not ours to replace or set aside.
        raise attempt.fail("invalid", None, f"--resume {args.resume}: {problem}")
    if own:
        # A rollback: the later checkpoints belong to the abandoned timeline and their names
        # will be written again.
        _set_aside_newer_than(attempt, ckpts, protocol.checkpoint_step(path) or 0)
    return path, _read_meta(attempt, path)


def _newest_verified_before(ckpts: CheckpointManager, step: int, skipped: list[dict[str, str]]) -> Path | None:
    """The newest checkpoint older than ``step`` whose manifest verifies; corrupt ones met are set aside."""
    for p in protocol.iter_checkpoint_dirs(ckpts.run_dir):
        if (protocol.checkpoint_step(p) or 0) >= step:
            continue
        problem = protocol.verify_checkpoint(p)
        if problem is None:
            return p
        log(f"skipping corrupt checkpoint {p.name}: {problem}")
        skipped.append({"name": p.name, "reason": problem})
        ckpts.set_aside(p, "corrupt")
    return None


def _set_aside_newer_than(attempt: Attempt, ckpts: CheckpointManager, step: int) -> None:
    for p in protocol.iter_checkpoint_dirs(attempt.run_dir):
        if (protocol.checkpoint_step(p) or 0) > step:
            dest = ckpts.set_aside(p, "abandoned")
            log(f"checkpoint {p.name} is newer than the resume point: moved aside to {dest.name}")


def _read_meta(attempt: Attempt, path: Path) -> dict[str, Any]:
    try:
        meta = CheckpointManager.read_json_file(path, "meta.json")
    except (OSError, ValueError) as e:
        raise attempt.fail("invalid", None, f"{path.name} has no readable meta.json: {e}") from None
    if not isinstance(meta, dict):
        raise attempt.fail("invalid", None, f"{path.name}/meta.json is not an object")
    return meta


def _check_resume_compatible(args: argparse.Namespace, attempt: Attempt, path: Path, meta: dict[str, Any],
                             data_sha256: str, micro: int, accum: int) -> tuple[int, int]:
    """Refuse a resume that would silently change the experiment; returns the (micro, accum) to run with."""
    # Resuming with another effective batch without changing accumulation makes the loss curve
    # incomparable and the LR schedule wrong (seed 002, common mistake 1): refuse unless asked.
    if meta.get("batch_size") != args.batch_size and not args.allow_batch_change:
        raise attempt.fail("invalid", None,
                           f"checkpoint {path.name} was trained with --batch-size "
                           f"{meta.get('batch_size')}, this run asks for {args.batch_size}; "
                           "pass --allow-batch-change to resume anyway")
    # An FSDP commit holds sharded state (DCP), a DDP or one-process one whole files: each loads only its own kind.
    if bool(meta.get("fsdp")) != bool(args.fsdp):
        how = "with" if meta.get("fsdp") else "without"
        raise attempt.fail("invalid", None, f"checkpoint {path.name} was written {how} --fsdp; resume it the same way")
    # The runbook's data_hash (seed 002): a resume on other data is a different experiment.
    if meta.get("data_sha256") != data_sha256 and not args.allow_data_change:
        raise attempt.fail("invalid", None,
                           f"corpus sha256 {data_sha256[:12]} differs from the checkpoint's "
                           f"{str(meta.get('data_sha256'))[:12]}; pass --allow-data-change to resume anyway")
    # An in-process OOM shrink is remembered: resuming at the size that ran out of memory would
    # only hit the same OOM again after a (possibly long) load.
    ck_micro = meta.get("micro_batch_size")
    if (meta.get("oom_events") and isinstance(ck_micro, int) and 0 < ck_micro < micro
            and args.batch_size % ck_micro == 0):
        log(f"micro-batch {micro} -> {ck_micro}: the checkpoint's run shrank it after an OOM")
        return ck_micro, args.batch_size // ck_micro
    return micro, accum


def _check_free_space(args: argparse.Namespace, attempt: Attempt) -> None:
    # Disk full at the first save, an hour in, wastes the hour (seed 002: Errno 28). Need room
    # for the new checkpoint while keep_last_k old ones still exist, plus result/.
    ckpt_bytes, result_bytes = checkpoint_bytes_estimate(PRESETS[args.preset], args.lora_rank)
    existing = len(list(protocol.iter_checkpoint_dirs(attempt.run_dir)))
    new_ckpts = args.keep_last_k + 1 - min(existing, args.keep_last_k)
    needed = new_ckpts * ckpt_bytes + result_bytes + (ckpt_bytes if args.save_fork_checkpoint else 0)
    free = shutil.disk_usage(attempt.run_dir).free
    if free < needed:
        # Step None: nothing is restored yet (the resumed step is known only after the load).
        raise attempt.fail("enospc", None,
                           f"{free} bytes free in {attempt.run_dir}, need about {needed} "
                           f"({new_ckpts} checkpoints of ~{ckpt_bytes} bytes + result)",
                           bytes_needed=needed, bytes_free=free)
