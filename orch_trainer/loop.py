"""The bundled trainer's attempt (``Trainer``) and its step loop (``TrainLoop``).

An attempt is four phases, each a function or object that takes what it needs and returns a typed
value the next one consumes, in order of cost (lesson 2, seed 000; the caller has already done the
argument checks and the "already complete" check)::

    preflight(...) -> Preflight    filesystem checks, before the model (trainer/preflight.py)
    load(...)      -> Loaded       model/data checks, restore (trainer/load.py)
    record_run_config(...) -> RunConfig
    TrainLoop(...).run() -> Trained    the steps: OOM recovery, NaN stop, saves, preemption (here)
    finish(...)    -> exit code    result/ and done.json (trainer/finish.py)

Late backstops stay where the expensive thing happens. Any phase reports a failure with
``raise attempt.fail(...)`` (trainer/attempt.py); ``Trainer.run`` turns it into the exit code.

Step numbering: ``step`` counts completed optimizer steps. Computing step ``s`` takes the run from
``s-1`` to ``s`` completed; checkpoint ``step-0000000s`` holds the state after it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from orch_trainer import runfiles
from orch_trainer.attempt import Attempt
from orch_trainer.faults import FaultInjector, cpu_oom_error
from orch_trainer.finish import finish
from orch_trainer.load import Loaded, RunConfig, load, record_run_config
from orch_trainer.model import PRESETS
from orch_trainer.oom import is_oom, largest_divisor_at_most
from orch_trainer.preflight import Preflight, pick_device, preflight
from orch_trainer.ranks import Ranks, init_group, leave, refusal
from orch_trainer.runfiles import log
from orch_trainer.state import autocast, checkpoint_meta, progress_fields, state_files
from orch_trainer.trained import Trained
from orch_trainer.trainerexit import TrainerExit
from orchestrator import protocol
from orchestrator.kit.checkpoint import CheckpointError, CheckpointManager
from orchestrator.kit.dist import StopAgreement, any_rank
from orchestrator.kit.heartbeat import Heartbeat
from orchestrator.kit.interval import AutoSaveInterval
from orchestrator.kit.preemption import PreemptionFlag
from orchestrator.kit.rng import capture_rng, restore_rng
from orchestrator.kit.sharded import ShardedCheckpointer, dcp_state

__all__ = ["BoundaryHook", "Trained", "TrainLoop", "Trainer", "TrainerExit", "is_oom", "micro_index"]

BoundaryHook = Callable[["Trainer", int, int], None]  # (trainer, step being computed, micro-batch index)
_SIGNAL_FAULTS = ("sigterm", "sigkill", "hang", "crash")


def micro_index(j: int, world: int, rank: int) -> int:
    """The global index of rank ``rank``'s ``j``-th micro-batch of a step: rank r takes r, r+world, ...

    The step's global batch is cut by global index, the same cut on any world size: with the data a pure function
    of the step, a resume on another world size trains on the same samples with the same effective batch.
    """
    return j * world + rank


@dataclass(frozen=True)
class Collective:
    """What a step loop of several ranks adds, all of it the kit's: one stop decision at step
    boundaries (``StopAgreement``) and one verified commit per step holding every rank's files
    (``ShardedCheckpointer``: rank 0 the replicated model/optimizer/meta, each rank its RNG)."""

    ranks: Ranks
    agreement: StopAgreement
    sckpts: ShardedCheckpointer
    fsdp: bool = False  # FSDP2 shards (saved through DCP) instead of DDP replicas


class Trainer:
    """One attempt of one run. ``run()`` returns the process exit code.

    Called by ``python -m orch_trainer`` (and in-process by tests and the bench) after the argument and
    "already complete" checks. ``boundary_hook`` is called at every micro-batch boundary with this
    object (tests stop or fail a run there, e.g. ``trainer.preemption.set(...)``).
    """

    def __init__(self, args: argparse.Namespace, run_dir: Path, attempt: int, job: str,
                 preemption: PreemptionFlag, boundary_hook: BoundaryHook | None = None) -> None:
        self.args = args
        self.run_dir = run_dir
        self.attempt = attempt
        self.job = job
        self.preemption = preemption
        self.boundary_hook = boundary_hook
        self.this_attempt = Attempt(run_dir, attempt, job)
        self.faults = FaultInjector(run_dir, list(args.inject_fault), attempt)
        self.ckpts = CheckpointManager(run_dir, args.keep_last_k, write_hook=self._checkpoint_write_hook)
        self.ranks = Ranks.from_env()
        # Every rank beats: rank 0 progress.json, another rank its own file (the hang policy judges the oldest).
        self.heartbeat = Heartbeat(run_dir, attempt, args.heartbeat_interval, rank=self.ranks.rank,
                                   world=self.ranks.world)
        # Set by run() as the phases complete; read by `step` (the crash report's step).
        self.loaded: Loaded | None = None
        self.loop: TrainLoop | None = None

    @property
    def step(self) -> int:
        """Completed optimizer steps so far: the loop's, else the restored checkpoint's, else 0."""
        if self.loop is not None:
            return self.loop.step
        return self.loaded.start_step if self.loaded is not None else 0

    def run(self) -> int:
        self.heartbeat.start()
        try:
            self._join_ranks()
            pre = preflight(self.args, self.this_attempt, self.ckpts, self.ranks)
            self.loaded = load(self.args, self.this_attempt, self.ckpts, pre)
            config = record_run_config(self.args, self.this_attempt, pre, self.loaded, self.ranks)
            self.loop = self.train_loop(pre, self.loaded, config)
            trained = self.loop.run()
            if self.loop.stop_requested():
                # A stop during the last step is never completion: that step is checkpointed and
                # the next attempt, with 0 steps left, writes the result.
                self.loop._rng_at_step_start = capture_rng()  # the RNG after the last step
                self.loop._preempt()
            loaded = _gathered(self.args, self.loaded, pre.device) if self.args.fsdp else self.loaded
            # rank 0 writes result/ and the completion; every rank leaves with its exit code
            return self.ranks.rank0_decides(lambda: finish(self.args, self.this_attempt, self.ckpts, self.heartbeat,
                                                           pre, loaded, trained))
        except TrainerExit as e:
            return e.code
        finally:
            self.heartbeat.stop()
            leave(self.ranks)

    def _join_ranks(self) -> None:
        """Refuse what several ranks cannot run (before any collective: every rank refuses alike), then join
        the process group (gloo on CPU, nccl on CUDA)."""
        why = refusal(self.args)
        if why is not None:
            raise self.this_attempt.fail("invalid", None, why)
        if self.ranks.multi:
            init_group(self.ranks, cuda=pick_device(self.args, self.ranks).type == "cuda")
            if self.args.background_save:
                log("several ranks: each checkpoint is one collective commit, written in the loop (no background save)")

    def train_loop(self, pre: Preflight, loaded: Loaded, config: RunConfig) -> TrainLoop:
        """The step loop of this attempt, wired to its faults, checkpoints, heartbeat and stop flag."""
        hook = None if self.boundary_hook is None else functools.partial(self.boundary_hook, self)
        collective = None
        if self.ranks.multi:
            collective = Collective(self.ranks, StopAgreement(self.preemption),
                                    ShardedCheckpointer(self.run_dir, self.args.keep_last_k,
                                                        write_hook=self._checkpoint_write_hook), fsdp=self.args.fsdp)
        return TrainLoop(self.args, self.this_attempt, pre, loaded, config, faults=self.faults,
                         ckpts=self.ckpts, heartbeat=self.heartbeat, preemption=self.preemption,
                         boundary_hook=hook, collective=collective)

    def _checkpoint_write_hook(self, step: int, path: str) -> None:
        # Inside the writer's write(): an injected disk-full takes the same path as a real one.
        if self.faults.take("enospc", step, at_or_after=True):
            raise FaultInjector.enospc_error(path)
        if self.faults.take("eio", step, at_or_after=True):
            raise FaultInjector.eio_error(path)


class TrainLoop:
    """The optimizer steps of one attempt, from ``loaded.start_step`` to ``args.max_steps``.

    ``run()`` returns :class:`Trained`, or raises ``TrainerExit`` after reporting an OOM at
    micro-batch 1, a NaN (before the optimizer step), a failed save, or a preemption (after saving
    the last completed step). ``boundary_hook(step, micro)`` runs at every micro-batch boundary.
    """

    def __init__(self, args: argparse.Namespace, attempt: Attempt, pre: Preflight, loaded: Loaded,
                 config: RunConfig, *, faults: FaultInjector, ckpts: CheckpointManager, heartbeat: Heartbeat,
                 preemption: PreemptionFlag, boundary_hook: Callable[[int, int], None] | None = None,
                 collective: Collective | None = None) -> None:
        self.args = args
        self.attempt = attempt
        self.faults = faults
        self.ckpts = ckpts
        self.heartbeat = heartbeat
        self.preemption = preemption
        self.boundary_hook = boundary_hook
        self.device = pre.device
        self.data_sha256 = pre.data_sha256
        self.resume_path = pre.resume_path
        self.model = loaded.model
        self.collective = collective
        self.world, self.rank = (collective.ranks.world, collective.ranks.rank) if collective else (1, 0)
        # What the steps run: the model itself, or DDP around it (gradients averaged over the ranks); the state
        # saved is always the model's own (the same keys on any world size).
        self.net: torch.nn.Module = self.model if collective is None or collective.fsdp else _ddp(self.model,
                                                                                                  pre.device)
        self._saved_path: Path | None = None
        self._saved_step = loaded.start_step  # the newest step saved (the resume point, until this attempt saves)
        self.trainable = loaded.trainable
        self.optimizer = loaded.optimizer
        self.scheduler = loaded.scheduler
        self.sampler = loaded.sampler
        self.step = loaded.start_step
        self.start_step = loaded.start_step
        self.micro = pre.micro
        self.accum = pre.accum
        self.oom_events = list(config.oom_events)
        self.config = dict(config.values)  # rewritten to run_config.json after an OOM shrink
        self.micro_batches_computed = 0
        self.tokens_per_step = args.batch_size * PRESETS[args.preset].block_size
        self._cuda = self.device.type == "cuda"
        self._autocast = autocast(self.device)
        # The RNG as it was when the step being computed began: an OOM redo and a preemption save use it.
        self._rng_at_step_start = capture_rng()
        self._computing_step = 0
        self._micro_in_step = 0
        self._last_loss = float("nan")  # of the last step this attempt computed (the heartbeat posts it)
        self._resumed_loss = loaded.last_loss  # step start_step's, as its checkpoint recorded it
        self._tok_s: float | None = None
        if "oom" in self.faults.pending_kinds:
            self.model.register_forward_pre_hook(self._oom_fault_hook)
        # --save-interval auto: Daly's interval for the measured save cost and orch's ORCH_MTBF_S
        self.auto_save = (AutoSaveInterval.for_run(attempt.run_dir, attempt.n) if args.save_interval == "auto"
                          else None)
        if self.auto_save is not None:
            log(f"--save-interval auto: MTBF {self.auto_save.mtbf_s:.0f} s ({self.auto_save.source})")

    def run(self) -> Trained:
        a = self.args
        self.model.train()
        t_start = time.perf_counter()
        self._post_progress(0.0)
        self.heartbeat.write_now()  # the history's first line is the resume step (orch plot marks it)
        for s in range(self.step + 1, a.max_steps + 1):
            self._computing_step = s
            self._rng_at_step_start = capture_rng()
            loss = self._compute_step_with_oom_retry(s)
            if loss is None:
                self._preempt()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, 1.0)
            if self.args.fsdp:
                grad_norm = grad_norm.full_tensor()  # a DTensor over the shards: the norm of the whole gradient
            loss_v, gn_v = torch.stack([loss.float(), grad_norm.float()]).tolist()  # one device sync
            if not (math.isfinite(loss_v) and math.isfinite(gn_v)):
                self._stop_on_nan(s, loss_v, gn_v)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step, self._last_loss = s, loss_v
            elapsed = time.perf_counter() - t_start
            tok_s = (s - self.start_step) * self.tokens_per_step / elapsed if elapsed > 0 else 0.0
            self._post_progress(tok_s)
            if (s % a.log_interval == 0 or s == a.max_steps) and self.rank == 0:
                log(f"step {s}/{a.max_steps} loss {loss_v:.4f} lr {self.scheduler.get_last_lr()[0]:.2e} "
                    f"tok/s {tok_s:.0f}")
            if a.sleep_per_step:
                time.sleep(a.sleep_per_step)  # a slower model's stand-in (--sleep-per-step)
            self._poll_save()
            if self._save_due(s):
                self._save(s, background=a.background_save)
        if self.step != self._saved_step:
            # The final step committed before completion is recorded: a failure after training (writing
            # result/, the user's export), fixed and requeued, resumes at the end, 0 steps retrained.
            self._save(self.step, background=False)
        return Trained(step=self.step, last_loss=self._loss_of_step(), tok_s=self._tok_s, micro=self.micro,
                       accum=self.accum, oom_events=tuple(self.oom_events),
                       micro_batches_computed=self.micro_batches_computed)

    def _loss_of_step(self) -> float:
        """The loss of step ``self.step``: this attempt's, or its checkpoint's when it computed none (a resume at the
        last step trains nothing, and its result still says the final loss). The heartbeat posts only this
        attempt's: a resume's first line has no loss, so ``orch plot`` draws no point twice."""
        return self._last_loss if self.step > self.start_step else self._resumed_loss

    # ============================ one step ========================================================
    def _compute_step_with_oom_retry(self, s: int) -> torch.Tensor | None:
        while True:
            oom_detail = None
            try:
                return self._accumulate(s)
            except Exception as e:  # re-raised unless it is an allocation failure
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
            x, y = self.sampler.micro_batch(starts, micro_index(j, self.world, self.rank), self.micro)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self._no_sync(j):
                with self._autocast:
                    loss = self.net(x, y)  # an injected OOM is raised in here, by the forward pre-hook
                if j == 0 and self.faults.take("nan", s):
                    loss = loss * float("nan")  # the forward's loss turns non-finite, as in a real blow-up
                (loss / self.accum).backward()
            total += loss.detach()
            self.micro_batches_computed += 1
        if self.collective is None:
            return total / self.accum
        return _global_mean(total / self.accum, self.world)  # the loss logged and saved: the global batch's

    def _no_sync(self, j: int) -> contextlib.AbstractContextManager[Any]:
        """DDP averages the gradients once per step, at the last micro-batch's backward."""
        if self.collective is None or self.collective.fsdp or j == self.accum - 1:
            return contextlib.nullcontext()  # FSDP: reduce-scatters at each backward into the sharded gradients
        return self.net.no_sync()  # type: ignore[operator]

    def stop_requested(self) -> bool:
        """Whether a stop was asked for: on several ranks, agreed by all (the same answer on every rank)."""
        return self.collective.agreement.agree() if self.collective is not None else self.preemption.requested

    def _at_boundary(self, s: int, j: int, fault_micro: int) -> bool:
        """A micro-batch boundary: the only place a stop request or a process fault acts."""
        if self.boundary_hook is not None:
            self.boundary_hook(s, j)
        if j == fault_micro and self.faults.pending_kinds:
            for kind in _SIGNAL_FAULTS:
                spec = self.faults.take(kind, s)
                if spec is not None:
                    FaultInjector.act_process_fault(spec)
        if self.collective is not None:
            # Several ranks agree at step boundaries only (one all-reduce, kit.dist.StopAgreement): every rank
            # then stops after the same step, however many saw the signal.
            return j == 0 and self.collective.agreement.should_stop()
        return self.preemption.requested

    def _oom_fault_hook(self, _module: torch.nn.Module, _inputs: Any) -> None:
        if self.faults.take("oom", self._computing_step):
            if self._cuda:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
            raise cpu_oom_error("(injected)")

    # ============================ failures inside a step ==========================================
    def _recover_from_oom(self, s: int, detail: str) -> None:
        """Composer's recipe: drop the partial step, halve the micro-batch, redo the same step."""
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self._cuda:
            torch.cuda.empty_cache()
        old = self.micro
        if self.collective is not None:
            # The ranks share each step's split: one rank cannot shrink its micro-batch alone.
            raise self.attempt.fail("oom", s, f"out of memory on rank {self.rank} of {self.world} (no in-process "
                                    f"micro-batch shrink with several ranks): {detail}",
                                    micro_batch_size=old, batch_size=self.args.batch_size)
        if old == 1:
            raise self.attempt.fail("oom", s, f"out of memory at micro-batch 1: {detail}",
                                    micro_batch_size=1, batch_size=self.args.batch_size)
        new = largest_divisor_at_most(self.args.batch_size, old // 2)
        self.micro, self.accum = new, self.args.batch_size // new
        event = {"attempt": self.attempt.n, "step": s, "micro_batch_size_before": old, "micro_batch_size": new,
                 "accumulation_steps": self.accum, "at": protocol.now_iso(), "detail": detail}
        self.oom_events.append(event)
        log(f"OOM at step {s}: micro-batch {old} -> {new}, accumulation {self.accum}, "
            f"effective batch {self.args.batch_size} kept; redoing step {s}")
        self.config.update(micro_batch_size=new, accumulation_steps=self.accum, oom_events=self.oom_events)
        runfiles.write_run_config(self.attempt.run_dir, self.config)
        restore_rng(self._rng_at_step_start)  # the redo draws the same dropout masks as a clean run

    def _stop_on_nan(self, s: int, loss_v: float, gn_v: float) -> None:
        # Stop BEFORE optimizer.step(): the weights are still those of step s-1, and nothing of
        # step s is saved (seed 002: a NaN checkpoint resumed is NaN forever).
        self.optimizer.zero_grad(set_to_none=True)
        with contextlib.suppress(CheckpointError):
            self.ckpts.wait()
        found = self.ckpts.latest_verified()
        last_good = str(found[1].relative_to(self.attempt.run_dir)) if found else None
        raise self.attempt.fail("nan", s, f"non-finite loss {loss_v} or grad norm {gn_v} at step {s}",
                                last_good_checkpoint=last_good, lr=self.optimizer.param_groups[0]["lr"],
                                loss=repr(loss_v), grad_norm=repr(gn_v))

    # ============================ saving and stopping =============================================
    def _save_due(self, s: int) -> bool:
        if self.auto_save is None:
            return s % self.args.save_interval == 0
        if self.collective is not None:  # a collective save: one decision (any rank's), or they hang
            return any_rank(self.auto_save.due())
        return self.auto_save.due()

    def _save(self, step: int, *, background: bool, rng: dict[str, Any] | None = None) -> None:
        rng = rng if rng is not None else capture_rng()
        meta = checkpoint_meta(self.args, step=step, micro=self.micro, accum=self.accum,
                               data_sha256=self.data_sha256, oom_events=self.oom_events, attempt=self.attempt.n,
                               world=self.world, loss=self._loss_of_step())
        files = state_files(self.model, self.optimizer, self.scheduler, rng, meta)
        t0 = time.monotonic()
        try:
            if self.collective is not None and self.collective.fsdp:
                # Every rank its shards of model and optimizer (DCP) and its RNG; rank 0 the scheduler and meta
                self._saved_path = self.collective.sckpts.save(
                    step, sharded=dcp_state(self.model, self.optimizer), per_rank={"rng.pt": rng},
                    replicated={"sched.pt": self.scheduler.state_dict(), "meta.json": meta})
            elif self.collective is not None:
                # One commit of every rank: rank 0 the replicated state, each rank its RNG (blocking, collective)
                per_rank = {"rng.pt": files.pop("rng.pt")}
                self._saved_path = self.collective.sckpts.save(step, replicated=files, per_rank=per_rank)
            else:
                self.ckpts.save(step, files, background=background)
        except CheckpointError as e:
            raise self.attempt.save_failed(e) from e
        self._saved_step = step
        if self.auto_save is not None:  # the loop's blocked time is the cost the interval weighs
            blocked = time.monotonic() - t0
            # total: the newest commit's (a collective save blocks for all of it)
            self.auto_save.record_save(blocked, blocked if self.collective is not None else self.ckpts.last_save_s)
        self._post_progress(saving=step)
        self.heartbeat.beat_now()

    def _poll_save(self) -> None:
        try:
            self.ckpts.poll()
        except CheckpointError as e:
            raise self.attempt.save_failed(e) from e

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
            self._save(self.step, background=False, rng=self._rng_at_step_start)
            if self.collective is not None:
                saved = self._saved_path
            else:
                saved = self.ckpts.last_committed[1] if self.ckpts.last_committed else None
        self.preemption.record_step(self.step)
        raise self.attempt.fail("preempted", self.step,
                                f"{self.preemption.reason} during step {self._computing_step}: saved the last "
                                f"completed step {self.step}", code=protocol.EXIT_PREEMPTED,
                                checkpoint=self.attempt.display_path(saved),
                                micro_batches_computed=self.micro_batches_computed,
                                micro_batches_discarded=self._micro_in_step,
                                steps_completed_this_attempt=self.step - self.start_step,
                                # epoch seconds the stop arrived ("at" is after the save): the
                                # Slurm bench splits signal -> exit from the scheduler's delays
                                stop_requested_time=self.preemption.requested_at)

    def _post_progress(self, tok_s: float | None = None, saving: int | None = None) -> None:
        if tok_s is not None:
            self._tok_s = tok_s
        self.heartbeat.post(**progress_fields(self.args, step=self.step, last_loss=self._last_loss,
                                              tok_s=self._tok_s, tokens_per_step=self.tokens_per_step,
                                              saving=saving, resumed_from=self.start_step),
                            **(self.auto_save.fields() if self.auto_save is not None else {}))


def _gathered(args: argparse.Namespace, loaded: Loaded, device: torch.device) -> Loaded:
    """FSDP: the whole model, on rank 0, for result/ and the eval loss (a collective: every rank calls it; the
    other ranks get ``loaded`` back, finish being rank 0's)."""
    import dataclasses

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from orch_trainer.model import TinyGPT

    full = get_model_state_dict(loaded.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not full:
        return loaded
    plain = TinyGPT(PRESETS[args.preset], args.lora_rank).to(device)
    plain.load_state_dict(full)
    return dataclasses.replace(loaded, model=plain)


def _ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DDP around ``model`` (its parameters broadcast from rank 0; gradients averaged at each step's end)."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def _global_mean(local: torch.Tensor, world: int) -> torch.Tensor:
    """The mean over the ranks of each rank's mean loss (equal micro-batch counts: the global batch's mean)."""
    import torch.distributed as dist

    out = local.detach().clone()
    dist.all_reduce(out)  # SUM: gloo has no AVG
    return out / world
