"""The training loop: resume, accumulate, recover from OOM, stop on NaN, save, obey preemption.

Checks run in order of cost (lesson 2, seed 000): the caller has already done the argument checks
and the "already complete" check; ``_preflight`` does the filesystem ones (corpus readable, which
checkpoint to resume and whether its batch/data match, free space) before the model exists;
``_load`` does the model/data ones (vocabulary, tensor shapes) before the first step; late backstops
stay where the expensive thing happens.

Step numbering: ``self.step`` counts completed optimizer steps. Computing step ``s`` takes the run
from ``s-1`` to ``s`` completed; checkpoint ``step-0000000s`` holds the state after it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import hashlib
import io
import math
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from orchestrator import protocol
from trainer import data as datamod
from trainer import runfiles
from trainer.checkpoint import CheckpointCorrupt, CheckpointError, CheckpointManager
from trainer.config import run_config
from trainer.faults import FaultInjector, cpu_oom_error
from trainer.heartbeat import Heartbeat
from trainer.model import PRESETS, TinyGPT, checkpoint_bytes_estimate
from trainer.preemption import PreemptionFlag
from trainer.runfiles import log

BoundaryHook = Callable[["Trainer", int, int], None]  # (trainer, step being computed, micro-batch index)
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_SIGNAL_FAULTS = ("sigterm", "sigkill", "hang", "crash")


class TrainerExit(Exception):
    """Unwind to ``Trainer.run`` with an exit code; the failure (if any) is already reported."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def is_oom(e: BaseException) -> bool:
    """CUDA OOM, or a CPU allocation failure (PyTorch raises a plain RuntimeError for those)."""
    if isinstance(e, torch.OutOfMemoryError):
        return True
    msg = str(e)
    return isinstance(e, RuntimeError) and (
        "DefaultCPUAllocator" in msg or "can't allocate memory" in msg or "failed to allocate" in msg.lower())


def capture_rng(cuda: bool) -> dict[str, Any]:
    rng: dict[str, Any] = {"python": random.getstate(), "torch_cpu": torch.get_rng_state()}
    if cuda:
        rng["torch_cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    version, state, gauss = rng["python"]
    random.setstate((version, tuple(state), gauss))
    torch.set_rng_state(rng["torch_cpu"])
    if "torch_cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["torch_cuda"])


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, max(limit, 1) + 1) if n % d == 0)


class Trainer:
    """One attempt of one run. ``run()`` returns the process exit code."""

    def __init__(self, args: argparse.Namespace, run_dir: Path, attempt: int, job: str,
                 preemption: PreemptionFlag, boundary_hook: BoundaryHook | None = None) -> None:
        self.args = args
        self.run_dir = run_dir
        self.attempt = attempt
        self.job = job
        self.preemption = preemption
        self.boundary_hook = boundary_hook
        self.faults = FaultInjector(run_dir, list(args.inject_fault), attempt)
        self.ckpts = CheckpointManager(run_dir, args.keep_last_k, write_hook=self._checkpoint_write_hook)
        self.heartbeat = Heartbeat(run_dir, attempt, args.heartbeat_interval)
        self.step = 0
        self.start_step = 0
        self.resumed_from: int | None = None
        self.micro = args.micro_batch_size
        self.accum = args.batch_size // self.micro
        self.oom_events: list[dict[str, Any]] = []
        self.micro_batches_computed = 0
        self.config: dict[str, Any] = {}
        self.resume_path: Path | None = None
        self.resume_meta: dict | None = None
        self.skipped_checkpoints: list[dict[str, str]] = []
        self._computing_step = 0
        self._micro_in_step = 0
        self._last_loss = float("nan")
        self._tok_s: float | None = None

    # =============================================================================================
    def run(self) -> int:
        self.heartbeat.start()
        try:
            self._preflight()
            self._load()
            self._write_run_config()
            self._train()
            return self._finish()
        except TrainerExit as e:
            return e.code
        finally:
            self.heartbeat.stop()

    def fail(self, cls: str, step: int | None, detail: str, code: int = protocol.EXIT_FAILURE_REPORTED,
             **extra: Any) -> TrainerExit:
        runfiles.report_failure(self.run_dir, self.attempt, cls, step, detail, **extra)
        return TrainerExit(code)

    # ============================ filesystem checks (before the model) ============================
    def _preflight(self) -> None:
        a = self.args
        self.ckpts.clean_stale()
        # Unreadable corpus: refuse now, not after the model is built (and not as a crash later).
        try:
            raw, source = datamod.read_corpus_bytes(a.data)
        except OSError as e:
            raise self.fail("invalid", None, f"corpus {a.data} unreadable: {e}") from None
        self.corpus_raw, self.corpus_source = raw, source
        self.data_sha256 = hashlib.sha256(raw).hexdigest()
        self.device = self._pick_device()
        self.resume_path, self.resume_meta = self._select_checkpoint()
        if self.resume_meta is not None:
            self._check_resume_compatible(self.resume_meta)
        self._check_free_space()

    def _pick_device(self) -> torch.device:
        if self.args.device == "cuda" and not torch.cuda.is_available():
            # Falling back to CPU would turn a 1-hour GPU job into a 3-day CPU job without a word.
            raise self.fail("invalid", None, "--device cuda but no CUDA device is available")
        if self.args.device == "cpu" or not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda")

    def _select_checkpoint(self) -> tuple[Path | None, dict | None]:
        """Pick the checkpoint to resume (reading only manifests and meta.json)."""
        a = self.args
        if a.resume == "none":
            self._set_aside_newer_than(-1)
            return None, None
        if a.resume == "auto":
            def report(path: Path, why: str) -> None:
                # A corrupt newest checkpoint is the kill -9 case of seed 002: skip it, say so, and
                # rename it so the same step can be written again and it is never picked later.
                log(f"skipping corrupt checkpoint {path.name}: {why}")
                self.skipped_checkpoints.append({"name": path.name, "reason": why})
                self.ckpts.set_aside(path, "corrupt")
            found = self.ckpts.latest_verified(on_corrupt=report)
            return (found[1], self._read_meta(found[1])) if found else (None, None)
        path = Path(a.resume)
        if not path.is_absolute() and (self.run_dir / path).exists():
            path = self.run_dir / path  # failure.json names checkpoints relative to the run dir
        problem = protocol.verify_checkpoint(path)
        if problem is not None:
            # An explicit resume point that does not verify is not replaced by another one silently.
            raise self.fail("invalid", None, f"--resume {a.resume}: {problem}")
        if path.parent.resolve() == self.ckpts.root.resolve():
            # A rollback: the later checkpoints belong to the abandoned timeline and their names
            # will be written again.
            self._set_aside_newer_than(protocol.checkpoint_step(path) or 0)
        return path, self._read_meta(path)

    def _set_aside_newer_than(self, step: int) -> None:
        for p in protocol.iter_checkpoint_dirs(self.run_dir):
            if (protocol.checkpoint_step(p) or 0) > step:
                dest = self.ckpts.set_aside(p, "abandoned")
                log(f"checkpoint {p.name} is newer than the resume point: moved aside to {dest.name}")

    def _read_meta(self, path: Path) -> dict:
        try:
            meta = CheckpointManager.read_json_file(path, "meta.json")
        except (OSError, ValueError) as e:
            raise self.fail("invalid", None, f"{path.name} has no readable meta.json: {e}") from None
        if not isinstance(meta, dict):
            raise self.fail("invalid", None, f"{path.name}/meta.json is not an object")
        return meta

    def _check_resume_compatible(self, meta: dict) -> None:
        a = self.args
        # Resuming with another effective batch without changing accumulation makes the loss curve
        # incomparable and the LR schedule wrong (seed 002, common mistake 1): refuse unless asked.
        if meta.get("batch_size") != a.batch_size and not a.allow_batch_change:
            raise self.fail("invalid", None,
                            f"checkpoint {self.resume_path.name} was trained with --batch-size "
                            f"{meta.get('batch_size')}, this run asks for {a.batch_size}; "
                            "pass --allow-batch-change to resume anyway")
        # The runbook's data_hash (seed 002): a resume on other data is a different experiment.
        if meta.get("data_sha256") != self.data_sha256 and not a.allow_data_change:
            raise self.fail("invalid", None,
                            f"corpus sha256 {self.data_sha256[:12]} differs from the checkpoint's "
                            f"{str(meta.get('data_sha256'))[:12]}; pass --allow-data-change to resume anyway")
        # An in-process OOM shrink is remembered: resuming at the size that ran out of memory would
        # only hit the same OOM again after a (possibly long) load.
        ck_micro = meta.get("micro_batch_size")
        if (meta.get("oom_events") and isinstance(ck_micro, int) and 0 < ck_micro < self.micro
                and a.batch_size % ck_micro == 0):
            log(f"micro-batch {self.micro} -> {ck_micro}: the checkpoint's run shrank it after an OOM")
            self.micro, self.accum = ck_micro, a.batch_size // ck_micro

    def _check_free_space(self) -> None:
        # Disk full at the first save, an hour in, wastes the hour (seed 002: Errno 28). Need room
        # for the new checkpoint while keep_last_k old ones still exist, plus result/.
        ckpt_bytes, result_bytes = checkpoint_bytes_estimate(PRESETS[self.args.preset], self.args.lora_rank)
        existing = len(list(protocol.iter_checkpoint_dirs(self.run_dir)))
        new_ckpts = self.args.keep_last_k + 1 - min(existing, self.args.keep_last_k)
        needed = new_ckpts * ckpt_bytes + result_bytes + (ckpt_bytes if self.args.save_fork_checkpoint else 0)
        free = shutil.disk_usage(self.run_dir).free
        if free < needed:
            raise self.fail("enospc", self.resumed_from,
                            f"{free} bytes free in {self.run_dir}, need about {needed} "
                            f"({new_ckpts} checkpoints of ~{ckpt_bytes} bytes + result)",
                            bytes_needed=needed, bytes_free=free)

    # ============================ model/data checks (after load) ==================================
    def _load(self) -> None:
        a = self.args
        torch.set_num_threads(a.threads)
        torch.manual_seed(a.seed)
        random.seed(a.seed)
        mcfg = PRESETS[a.preset]
        corpus = datamod.encode_corpus(self.corpus_raw, self.corpus_source)
        self.corpus = corpus
        if corpus.lines_skipped:
            log(f"skipped {corpus.lines_skipped} of {corpus.lines_total} corpus lines "
                f"(first: {corpus.skipped_examples[0]}); `python -m trainer scan-data` lists them all")
        train_tokens, eval_tokens = datamod.split(corpus)
        # Too little usable text: every window would index past the end (an IndexError mid-step).
        if len(eval_tokens) < mcfg.block_size + 1 or len(train_tokens) < mcfg.block_size + 1:
            raise self.fail("invalid", None,
                            f"corpus has {len(corpus.tokens)} usable tokens after skipping "
                            f"{corpus.lines_skipped} bad lines; need at least {10 * (mcfg.block_size + 1)}")
        # The model's embedding rows must be the vocabulary the data is encoded with.
        if corpus.vocab_size != mcfg.vocab_size:
            raise self.fail("invalid", None,
                            f"vocabulary {corpus.vocab_size} != model vocabulary {mcfg.vocab_size}")
        self.sampler = datamod.BatchSampler(train_tokens, mcfg.block_size, a.seed)
        self.eval_tokens = eval_tokens
        self.model = TinyGPT(mcfg, a.lora_rank).to(self.device)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.trainable, lr=a.lr, weight_decay=0.01)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        if "oom" in self.faults.pending_kinds:
            self.model.register_forward_pre_hook(self._oom_fault_hook)
        if self.resume_path is not None:
            self._restore(self.resume_path)

    def _lr_factor(self, step: int) -> float:
        """Linear warmup, then cosine decay to 10 % at max_steps (LambdaLR counts completed steps)."""
        w, n = self.args.warmup_steps, self.args.max_steps
        if step < w:
            return (step + 1) / w
        frac = min(1.0, (step - w) / max(1, n - w))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    def _restore(self, path: Path) -> None:
        try:
            state = self.ckpts.load(path, map_location="cpu")
        except CheckpointCorrupt as e:
            raise self.fail("invalid", None, f"cannot load {path.name}: {e}") from None
        meta = state["meta.json"]
        # Same shapes or refuse: a checkpoint of another preset or LoRA rank would fail inside
        # load_state_dict with a 40-line message, or worse, half-load.
        if meta.get("vocab") != datamod.VOCAB:
            raise self.fail("invalid", None, f"{path.name} was trained with another vocabulary")
        try:
            self.model.load_state_dict(state["model.pt"])
            self.optimizer.load_state_dict(state["optim.pt"]["optimizer"])
            self.scheduler.load_state_dict(state["optim.pt"]["scheduler"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise self.fail("invalid", None,
                            f"{path.name} does not fit this model (preset {self.args.preset}, "
                            f"lora rank {self.args.lora_rank}): {str(e)[:500]}") from None
        restore_rng(state["rng.pt"])
        self.step = self.start_step = int(meta["step"])
        self.resumed_from = self.step
        self.oom_events = list(meta.get("oom_events") or [])
        log(f"resumed from {path.name} (step {self.step})")

    def _write_run_config(self) -> None:
        cfg = run_config(self.args)
        prev = runfiles.read_run_config(self.run_dir) if self.resumed_from is not None else {}
        known = {(e.get("attempt"), e.get("step")) for e in self.oom_events if isinstance(e, dict)}
        for e in prev.get("oom_events") or []:  # events after the last checkpoint of an earlier attempt
            if isinstance(e, dict) and (e.get("attempt"), e.get("step")) not in known:
                self.oom_events.append(e)
        cfg.update(
            run_dir=str(self.run_dir), micro_batch_size=self.micro, resumed_from_step=self.resumed_from,
            resumed_from=self._display_path(self.resume_path),
            data_sha256=self.data_sha256, data_source=self.corpus_source,
            data_lines_total=self.corpus.lines_total, data_lines_skipped=self.corpus.lines_skipped,
            skipped_checkpoints=self.skipped_checkpoints, oom_events=self.oom_events,
            accumulation_steps=self.accum, device=self.device.type, device_requested=self.args.device,
            attempt=self.attempt, job=self.job, model=PRESETS[self.args.preset].to_dict(),
        )
        self.config = cfg
        runfiles.write_run_config(self.run_dir, cfg)

    def _display_path(self, path: Path | None) -> str | None:
        """Relative to the run dir when inside it (how failure.json names checkpoints), else absolute."""
        if path is None:
            return None
        return str(path.relative_to(self.run_dir)) if self._inside(path) else str(path)

    def _inside(self, path: Path | None) -> bool:
        return path is not None and path.resolve().is_relative_to(self.run_dir.resolve())

    # ============================ the loop ========================================================
    def _train(self) -> None:
        a = self.args
        self.model.train()
        cuda = self.device.type == "cuda"
        self._autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext())
        t_start, tokens_per_step = time.perf_counter(), a.batch_size * PRESETS[a.preset].block_size
        self._post_progress(0.0)
        self.heartbeat.write_now()  # the history's first line is the resume step (orch plot marks it)
        for s in range(self.step + 1, a.max_steps + 1):
            self._computing_step = s
            self.rng_at_step_start = capture_rng(cuda)
            loss = self._compute_step_with_oom_retry(s)
            if loss is None:
                self._preempt()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, 1.0)
            loss_v, gn_v = torch.stack([loss.float(), grad_norm.float()]).tolist()  # one device sync
            if not (math.isfinite(loss_v) and math.isfinite(gn_v)):
                self._stop_on_nan(s, loss_v, gn_v)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step, self._last_loss = s, loss_v
            elapsed = time.perf_counter() - t_start
            tok_s = (s - self.start_step) * tokens_per_step / elapsed if elapsed > 0 else 0.0
            self._post_progress(tok_s)
            if s % a.log_interval == 0 or s == a.max_steps:
                log(f"step {s}/{a.max_steps} loss {loss_v:.4f} lr {self.scheduler.get_last_lr()[0]:.2e} "
                    f"tok/s {tok_s:.0f}")
            self._poll_save()
            if s % a.save_interval == 0:
                self._save(s, background=a.background_save)

    def _compute_step_with_oom_retry(self, s: int) -> torch.Tensor | None:
        while True:
            oom_detail = None
            try:
                return self._accumulate(s)
            except Exception as e:  # noqa: BLE001 - re-raised unless it is an allocation failure
                if not is_oom(e):
                    raise
                oom_detail = f"{type(e).__name__}: {str(e)[:300]}"
            # Outside the except block: the traceback (and the activations it pins) is gone now.
            self._recover_from_oom(s, oom_detail)

    def _accumulate(self, s: int) -> torch.Tensor | None:
        """Forward/backward of every micro-batch of step ``s``; None if a stop was requested."""
        starts = self.sampler.step_starts(s - 1 + self.args.skip_batches, self.args.batch_size)
        fault_micro = min(1, self.accum - 1)
        total = torch.zeros((), device=self.device)
        for j in range(self.accum):
            self._micro_in_step = j
            if self._at_boundary(s, j, fault_micro):
                return None
            x, y = self.sampler.micro_batch(starts, j, self.micro)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self._autocast:
                loss = self.model(x, y)  # an injected OOM is raised in here, by the forward pre-hook
            if j == 0 and self.faults.take("nan", s):
                loss = loss * float("nan")  # the forward's loss turns non-finite, as in a real blow-up
            (loss / self.accum).backward()
            total += loss.detach()
            self.micro_batches_computed += 1
        return total / self.accum

    def _at_boundary(self, s: int, j: int, fault_micro: int) -> bool:
        """A micro-batch boundary: the only place a stop request or a process fault acts."""
        if self.boundary_hook is not None:
            self.boundary_hook(self, s, j)
        if j == fault_micro and self.faults.pending_kinds:
            for kind in _SIGNAL_FAULTS:
                spec = self.faults.take(kind, s)
                if spec is not None:
                    FaultInjector.act_process_fault(spec)
        return self.preemption.requested

    def _oom_fault_hook(self, _module: torch.nn.Module, _inputs: Any) -> None:
        if self.faults.take("oom", self._computing_step):
            if self.device.type == "cuda":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
            raise cpu_oom_error("(injected)")

    def _checkpoint_write_hook(self, step: int, path: str) -> None:
        # Inside the writer's write(): an injected disk-full takes the same path as a real one.
        if self.faults.take("enospc", step, at_or_after=True):
            raise FaultInjector.enospc_error(path)

    def _recover_from_oom(self, s: int, detail: str) -> None:
        """Composer's recipe: drop the partial step, halve the micro-batch, redo the same step."""
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        old = self.micro
        if old == 1:
            raise self.fail("oom", s, f"out of memory at micro-batch 1: {detail}",
                            micro_batch_size=1, batch_size=self.args.batch_size)
        new = _largest_divisor_at_most(self.args.batch_size, old // 2)
        self.micro, self.accum = new, self.args.batch_size // new
        event = {"attempt": self.attempt, "step": s, "micro_batch_size_before": old, "micro_batch_size": new,
                 "accumulation_steps": self.accum, "at": protocol.now_iso(), "detail": detail}
        self.oom_events.append(event)
        log(f"OOM at step {s}: micro-batch {old} -> {new}, accumulation {self.accum}, "
            f"effective batch {self.args.batch_size} kept; redoing step {s}")
        self.config.update(micro_batch_size=new, accumulation_steps=self.accum, oom_events=self.oom_events)
        runfiles.write_run_config(self.run_dir, self.config)
        restore_rng(self.rng_at_step_start)  # the redo draws the same dropout masks as a clean run

    def _stop_on_nan(self, s: int, loss_v: float, gn_v: float) -> None:
        # Stop BEFORE optimizer.step(): the weights are still those of step s-1, and nothing of
        # step s is saved (seed 002: a NaN checkpoint resumed is NaN forever).
        self.optimizer.zero_grad(set_to_none=True)
        with contextlib.suppress(CheckpointError):
            self.ckpts.wait()
        found = self.ckpts.latest_verified()
        last_good = str(found[1].relative_to(self.run_dir)) if found else None
        raise self.fail("nan", s, f"non-finite loss {loss_v} or grad norm {gn_v} at step {s}",
                        last_good_checkpoint=last_good, lr=self.optimizer.param_groups[0]["lr"],
                        loss=repr(loss_v), grad_norm=repr(gn_v))

    # ============================ saving ==========================================================
    def _state_files(self, step: int, rng: dict[str, Any]) -> dict[str, Any]:
        a = self.args
        meta = {"step": step, "batch_size": a.batch_size, "micro_batch_size": self.micro,
                "accumulation_steps": self.accum, "skip_batches": a.skip_batches, "seed": a.seed,
                "data_sha256": self.data_sha256, "preset": a.preset, "lora_rank": a.lora_rank,
                "model": PRESETS[a.preset].to_dict(), "vocab": datamod.VOCAB, "oom_events": self.oom_events,
                "attempt": self.attempt, "saved_at": protocol.now_iso()}
        return {"model.pt": self.model.state_dict(),
                "optim.pt": {"optimizer": self.optimizer.state_dict(),
                             "scheduler": self.scheduler.state_dict()},
                "rng.pt": rng, "meta.json": meta}

    def _save(self, step: int, *, background: bool, rng: dict[str, Any] | None = None) -> None:
        files = self._state_files(step, rng if rng is not None else capture_rng(self.device.type == "cuda"))
        try:
            self.ckpts.save(step, files, background=background)
        except CheckpointError as e:
            self._save_failed(e)
        self._post_progress(saving=step)
        self.heartbeat.beat_now()

    def _poll_save(self) -> None:
        try:
            self.ckpts.poll()
        except CheckpointError as e:
            self._save_failed(e)

    def _save_failed(self, e: CheckpointError) -> None:
        cause = e.cause
        free = shutil.disk_usage(self.run_dir).free
        if isinstance(cause, OSError) and cause.errno in _DISK_FULL:
            raise self.fail("enospc", e.step, f"checkpoint step {e.step} did not fit: {cause}; "
                            f"previous checkpoints are intact", bytes_needed=e.bytes_needed, bytes_free=free)
        raise self.fail("crash", e.step, f"checkpoint step {e.step} failed: {cause!r}; "
                        "previous checkpoints intact", bytes_free=free)

    def _preempt(self) -> None:
        """Save the last completed step (the partial accumulation is discarded) and exit 143."""
        self.optimizer.zero_grad(set_to_none=True)
        try:
            self.ckpts.wait()  # never two saves in flight, and the in-flight one must commit first
        except CheckpointError as e:
            log(f"background save before preemption failed: {e}")
        saved: Path | None = None
        if self.step == self.start_step:
            saved = self.resume_path  # no step completed in this attempt: nothing new to save
        else:
            # The RNG as it was when the discarded step began = as it was after the last completed one.
            self._save(self.step, background=False, rng=self.rng_at_step_start)
            saved = self.ckpts.last_committed[1] if self.ckpts.last_committed else None
        ckpt = self._display_path(saved)
        raise self.fail("preempted", self.step,
                        f"{self.preemption.reason} during step {self._computing_step}: saved the last "
                        f"completed step {self.step}", code=protocol.EXIT_PREEMPTED, checkpoint=ckpt,
                        micro_batches_computed=self.micro_batches_computed,
                        micro_batches_discarded=self._micro_in_step,
                        steps_completed_this_attempt=self.step - self.start_step)

    # ============================ finishing =======================================================
    def _post_progress(self, tok_s: float | None = None, saving: int | None = None) -> None:
        if tok_s is not None:
            self._tok_s = tok_s
        fields = {"step": self.step, "loss": self._last_loss if math.isfinite(self._last_loss) else None,
                  "tokens_per_s": self._tok_s, "max_steps": self.args.max_steps,
                  "tokens_per_step": self.args.batch_size * PRESETS[self.args.preset].block_size}
        if saving is not None:
            fields["saved_step"] = saving
        self.heartbeat.post(**fields)

    @torch.no_grad()
    def _eval_loss(self) -> float:
        """Mean loss on 16 fixed windows of the held-out split (no RNG used: exact resume unaffected)."""
        self.model.eval()
        block = PRESETS[self.args.preset].block_size
        n = len(self.eval_tokens) - block - 1
        starts = torch.linspace(0, max(n, 0), 16).long()
        rows = self.eval_tokens[starts[:, None] + torch.arange(block + 1)].long().to(self.device)
        with self._autocast:
            loss = self.model(rows[:, :-1], rows[:, 1:])
        self.model.train()
        return float(loss)

    def _finish(self) -> int:
        try:
            self.ckpts.wait()
        except CheckpointError as e:
            self._save_failed(e)
        result = self.run_dir / protocol.RESULT_DIR
        artifacts = [f"{protocol.RESULT_DIR}/model.pt", f"{protocol.RESULT_DIR}/metrics.json"]
        eval_loss = self._eval_loss()
        try:
            result.mkdir(exist_ok=True)
            protocol.atomic_write(result / "model.pt", _torch_bytes(self.model.plain_state_dict()))
            if self.args.save_fork_checkpoint:
                # Late backstop of the parse-time refusal: a fork checkpoint can also be asked for by
                # a script that builds the args itself; under LoRA it would pair full weights with an
                # adapter-only optimizer state.
                if self.args.lora_rank:
                    raise self.fail("invalid", self.step, "--save-fork-checkpoint with --lora-rank refused")
                fork = CheckpointManager(result, keep_last_k=1).save(
                    self.step, self._state_files(self.step, capture_rng(self.device.type == "cuda")))
                artifacts += [str((fork / name).relative_to(self.run_dir)) for name in
                              protocol.read_json_bounded(fork / protocol.MANIFEST)["files"]]
                artifacts.append(str((fork / protocol.MANIFEST).relative_to(self.run_dir)))
            metrics = {"final_loss": self._last_loss if math.isfinite(self._last_loss) else None,
                       "eval_loss": eval_loss, "steps": self.step, "attempt": self.attempt,
                       "resumed_from_step": self.resumed_from,
                       "micro_batches_computed": self.micro_batches_computed,
                       "micro_batch_size": self.micro, "batch_size": self.args.batch_size,
                       "oom_events": len(self.oom_events), "data_lines_skipped": self.corpus.lines_skipped}
            protocol.atomic_write_json(result / "metrics.json", metrics)
            protocol.write_done_marker(self.run_dir, self.job, self.attempt, artifacts)  # the very last step
        except CheckpointError as e:
            self._save_failed(e)
        except OSError as e:
            cls = "enospc" if e.errno in _DISK_FULL else "crash"
            raise self.fail(cls, self.step, f"writing result/ failed: {e!r}; done.json not written",
                            bytes_free=shutil.disk_usage(self.run_dir).free) from None
        self._post_progress()
        log(f"finished {self.step} steps; eval loss {eval_loss:.4f}; done.json written")
        return protocol.EXIT_OK


def _torch_bytes(obj: Any) -> bytes:
    """Serialized for ``protocol.atomic_write`` (tmp + fsync + rename + dir fsync): result/ is small."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
