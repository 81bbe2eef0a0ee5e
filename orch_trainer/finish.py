"""Last phase of an attempt: the eval loss, result/ and the completion (lesson 1).

The end is the kit's ``record_completion``, the same as every integration's: under orch's wrapper, the
completion record (``attempts/<n>/complete.json``; the wrapper writes done.json once the trainer exits 0);
run by hand (``python -m orch_trainer --run-dir X``), done.json at once, written last, atomically, listing
every result file with its size and sha256: a run is done only when
``orchestrator.protocol.verify_done_marker`` says so, never because result/ exists. If anything before it
fails, the failure is classified (a full disk is ``enospc``, retryable) and nothing is marked complete.
"""

from __future__ import annotations

import argparse
import io
import math
import shutil
from contextlib import AbstractContextManager
from typing import Any

import torch

from orch_trainer.attempt import Attempt
from orch_trainer.load import Loaded
from orch_trainer.model import PRESETS, TinyGPT
from orch_trainer.preflight import Preflight
from orch_trainer.runfiles import log
from orch_trainer.state import autocast, checkpoint_meta, progress_fields, state_files
from orch_trainer.trained import Trained
from orchestrator import protocol
from orchestrator.kit.checkpoint import CheckpointError, CheckpointManager
from orchestrator.kit.heartbeat import Heartbeat
from orchestrator.kit.rng import capture_rng
from orchestrator.kit.run import record_completion


def finish(args: argparse.Namespace, attempt: Attempt, ckpts: CheckpointManager, heartbeat: Heartbeat,
           pre: Preflight, loaded: Loaded, trained: Trained) -> int:
    """Wait for the in-flight save, write result/ and then done.json; returns ``EXIT_OK``.

    A failure raises ``attempt.fail(...)`` (enospc, crash, or invalid for the fork backstop) and
    leaves no marker; the checkpoints stay, so the retry resumes at the last one.
    """
    try:
        ckpts.wait()
    except CheckpointError as e:
        raise attempt.save_failed(e) from e
    result = attempt.run_dir / protocol.RESULT_DIR
    artifacts = [f"{protocol.RESULT_DIR}/model.pt", f"{protocol.RESULT_DIR}/metrics.json"]
    eval_loss = _eval_loss(loaded.model, loaded.eval_tokens, PRESETS[args.preset].block_size, pre.device,
                           autocast(pre.device))
    try:
        result.mkdir(exist_ok=True)
        protocol.atomic_write(result / "model.pt", _torch_bytes(loaded.model.plain_state_dict()))
        if args.save_fork_checkpoint:
            # Late backstop of the parse-time refusal: a fork checkpoint can also be asked for by
            # a script that builds the args itself; under LoRA it would pair full weights with an
            # adapter-only optimizer state.
            if args.lora_rank:
                raise attempt.fail("invalid", trained.step, "--save-fork-checkpoint with --lora-rank refused")
            rng = capture_rng()
            meta = checkpoint_meta(args, step=trained.step, micro=trained.micro, accum=trained.accum,
                                   data_sha256=pre.data_sha256, oom_events=trained.oom_events, attempt=attempt.n,
                                   loss=trained.last_loss)
            fork = CheckpointManager(result, keep_last_k=1).save(
                trained.step, state_files(loaded.model, loaded.optimizer, loaded.scheduler, rng, meta))
            artifacts += [str((fork / name).relative_to(attempt.run_dir)) for name in
                          protocol.read_json_bounded(fork / protocol.MANIFEST)["files"]]
            artifacts.append(str((fork / protocol.MANIFEST).relative_to(attempt.run_dir)))
        metrics = {"final_loss": trained.last_loss if math.isfinite(trained.last_loss) else None,
                   "eval_loss": eval_loss, "steps": trained.step, "attempt": attempt.n,
                   "resumed_from_step": loaded.resumed_from,
                   "micro_batches_computed": trained.micro_batches_computed,
                   "micro_batch_size": trained.micro, "batch_size": args.batch_size,
                   "oom_events": len(trained.oom_events), "data_lines_skipped": loaded.corpus.lines_skipped}
        protocol.atomic_write_json(result / "metrics.json", metrics)
        record_completion(attempt.run_dir, attempt.job, attempt.n, artifacts, step=trained.step)  # the very last step
    except CheckpointError as e:
        raise attempt.save_failed(e) from e
    except OSError as e:
        cls = protocol.write_error_class(e)
        raise attempt.fail(cls, trained.step, f"writing result/ failed: {e!r}; done.json not written",
                           bytes_free=shutil.disk_usage(attempt.run_dir).free) from None
    heartbeat.post(**progress_fields(args, step=trained.step, last_loss=trained.last_loss, tok_s=trained.tok_s,
                                     tokens_per_step=args.batch_size * PRESETS[args.preset].block_size,
                                     resumed_from=loaded.start_step))
    log(f"finished {trained.step} steps; eval loss {eval_loss:.4f}; completion recorded")
    return protocol.EXIT_OK


@torch.no_grad()
def _eval_loss(model: TinyGPT, eval_tokens: torch.Tensor, block: int, device: torch.device,
               ctx: AbstractContextManager[Any]) -> float:
    """Mean loss on 16 fixed windows of the held-out split (no RNG used: exact resume unaffected)."""
    model.eval()
    n = len(eval_tokens) - block - 1
    starts = torch.linspace(0, max(n, 0), 16).long()
    rows = eval_tokens[starts[:, None] + torch.arange(block + 1)].long().to(device)
    with ctx:
        loss = model(rows[:, :-1], rows[:, 1:])
    model.train()
    return float(loss)


def _torch_bytes(obj: Any) -> bytes:
    """Serialized for ``protocol.atomic_write`` (tmp + fsync + rename + dir fsync): result/ is small."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
