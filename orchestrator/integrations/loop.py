"""Plain PyTorch loops: orch's guarantees in three lines around an existing loop.

::

    from orchestrator.integrations.loop import orch_run           # 1
    with orch_run(model, optimizer, scheduler) as run:             # 2
        for step in run.steps(max_steps):                          # 3 (was: for step in range(...))
            loss = train_one_step(step)
            run.log(loss=loss.item())                               # optional: progress.json shows it

What it guarantees (measured in tests/integrations/test_loop.py and test_tracker_curves.py):

* on entry, a run dir whose ``done.json`` verifies exits 0 at once ("already complete"), writing nothing;
  otherwise model, optimizer, scheduler, the global RNGs (python, torch, CUDA, numpy) and the ``state``
  dict you pass (e.g. a data position) are restored from the newest *verified* checkpoint, so a loop whose
  batches depend on the step or on the global RNG continues bit for bit;
* every ``save_every`` steps a checkpoint is written in a background thread (the loop waits only for a
  copy of the state to CPU memory);
* on SIGTERM or SIGUSR2 (from orch or from anywhere: ``attempts/<n>/stop.json`` records it) the step in
  flight completes, the last completed step is checkpointed at the step boundary, ``failure.json`` says
  ``preempted`` and the process exits 143: 0 steps are redone. A signal during the last step is a stop
  too (never completion): the last step is checkpointed and the next attempt only writes the result;
* when the ``with`` body ends normally, ``result/model.pt`` (the model's state dict) and
  ``result/metrics.json`` are written and training is recorded complete (``attempts/<n>/complete.json``);
  orch writes ``done.json`` only once the script exits 0, listing everything under ``result/`` then, so
  files the script writes to ``run.result_dir`` after the ``with`` block are listed too, and an
  exception after it (an export, an eval) is a crash, never verified. Without orch: ``done.json`` at once.

Step numbering: ``steps(n)`` yields 1..n; when the body for step ``s`` returns, step ``s`` is complete and
``checkpoints/step-<s>`` holds the state after it. Without orch pass ``run_dir=``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from orchestrator import protocol
from orchestrator.kit import heartbeat
from orchestrator.kit.checkpoint import CheckpointManager
from orchestrator.kit.commit import clean_stale
from orchestrator.kit.dist import StopAgreement, any_rank, barrier, settle, world_size
from orchestrator.kit.interval import AutoSaveInterval
from orchestrator.kit.log import log
from orchestrator.kit.preemption import PreemptionFlag
from orchestrator.kit.rng import capture_rng, restore_rng
from orchestrator.kit.run import Run, signal_name
from orchestrator.kit.sharded import ShardedCheckpointer, dcp_state, is_sharded, set_dcp_state
from orchestrator.kit.trackers import StopTolerance


class OrchRun:
    """The handle ``orch_run`` yields: ``steps()``, ``log()``, ``step``, ``resumed_from``, ``result_dir``.

    Create it in the main thread (it installs the SIGTERM/SIGUSR2 handler). Under torch.distributed every
    rank enters it and the ranks agree on a stop at step boundaries (``StopAgreement``: one all-reduce,
    every N steps where a step is very short). ``sharded`` (default: on when the process group has more
    than one rank): every rank writes its part of each checkpoint (``ShardedCheckpointer``: model and
    optimizer through torch.distributed.checkpoint, so FSDP shards and a resume on another world size
    work; RNG per rank; ``state`` and the scheduler from rank 0), one verified commit per step; such saves
    are blocking. Otherwise rank 0 writes the whole state, in the background.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scheduler: Any = None, *, state: dict[str, Any] | None = None, save_every: int | str | None = 100,
                 keep_last_k: int = 2, run_dir: str | os.PathLike[str] | None = None,
                 sharded: bool | None = None) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.state = state if state is not None else {}
        self.save_every = save_every
        # save_every="auto": Daly's interval for the measured save cost and orch's ORCH_MTBF_S (kit/interval.py)
        self.auto_save = AutoSaveInterval() if save_every == "auto" else None
        self.keep_last_k = keep_last_k
        self._run_dir_arg = run_dir
        self._sharded_arg = sharded
        self.step = 0
        self.resumed_from: int | None = None
        self._fields: dict[str, Any] = {}
        self._saved_step: int | None = None
        self._saved_path: Path | None = None
        self._stopped = False

    # --- entering: resume ------------------------------------------------------------------------
    def __enter__(self) -> OrchRun:
        self.run = Run.from_env(self._run_dir_arg)
        if self.run.already_complete():
            raise SystemExit(protocol.EXIT_OK)
        # First, before the (possibly long) restore: a SIGTERM from here on ends as a clean preemption.
        self.flag = PreemptionFlag().install()
        self.agreement = StopAgreement(self.flag)
        self.tolerance = StopTolerance(lambda: self.flag.requested or self._stopped)
        self.run.begin()
        if self.run.is_writer:
            clean_stale(self.run.run_dir)
        self.ckpts = CheckpointManager(self.run.run_dir, self.keep_last_k)
        self.sharded = world_size() > 1 if self._sharded_arg is None else self._sharded_arg
        self.sckpts = ShardedCheckpointer(self.run.run_dir, self.keep_last_k)
        if self.sharded or world_size() > 1:
            # Rank 0 picks from manifests and sizes; every rank hashes its share of the files (in parallel).
            found = self.sckpts.resume(lambda: self.run.resume_checkpoint(hashes=False))
        else:
            found = self.run.resume_checkpoint()
        if found is not None:
            self._restore(*found)
        self.run.resumed(self.step)  # ORCH_RESUME_STEP; TensorBoard hides a killed attempt's later points
        # Every rank beats (rank 0 progress.json, the others their own file): a hung rank 1 is seen as such.
        self.heartbeat = heartbeat.for_rank(self.run.run_dir, self.run.attempt, self.run.heartbeat_s,
                                            writer=self.run.is_writer, rank=self.sckpts.rank,
                                            world=self.sckpts.world)
        if self.heartbeat is not None:
            # the history's first line is the resume step, now: where goodput's startup (restore included) ends
            self.heartbeat.post(step=self.step, resumed_from=self.resumed_from or 0)
            self.heartbeat.write_now()
        if self.auto_save is not None:  # δ from the previous attempt; the interval from this loop's start
            self.auto_save.resume_from(self.run.run_dir, self.run.attempt)
        return self

    def _sharded_state(self) -> dict[str, Any]:
        """Model (and optimizer) state as torch.distributed.checkpoint saves and reshards it."""
        return dcp_state(self.model, self.optimizer)

    def _restore(self, step: int, path: Path) -> None:
        if is_sharded(path):
            sharded = self._sharded_state()
            loaded = self.sckpts.load(path, sharded=sharded)  # resume() verified every file
            set_dcp_state(self.model, self.optimizer, sharded)
        else:
            loaded = CheckpointManager.load(path)  # verifies every sha256 again, then torch.load(weights_only)
            self.model.load_state_dict(loaded["model.pt"])
            if self.optimizer is not None and "optim.pt" in loaded:
                self.optimizer.load_state_dict(loaded["optim.pt"])
        if self.scheduler is not None and "sched.pt" in loaded:
            self.scheduler.load_state_dict(loaded["sched.pt"])
        if "state.pt" in loaded:
            self.state.clear()
            self.state.update(loaded["state.pt"])
        if "rng.pt" in loaded:
            restore_rng(loaded["rng.pt"])
        else:  # saved on another world size: each rank keeps the RNG the program seeded
            log(f"{path.name} was saved on another world size: per-rank RNG states not restored")
        self.step = self.resumed_from = self._saved_step = step
        self._saved_path = path
        log(f"resumed from {path.name} (step {step})")

    # --- the loop ----------------------------------------------------------------------------------
    @property
    def result_dir(self) -> Path:
        """``<run dir>/result``: what you write there is listed in the done marker."""
        return self.run.result_dir

    @property
    def tensorboard_dir(self) -> Path:
        """The run's one TensorBoard log dir (``ORCH_TENSORBOARD_DIR``): every attempt's ``SummaryWriter`` here
        makes one curve; a killed attempt's points past the resume step are hidden (``Run.resumed``)."""
        return self.run.tensorboard_dir

    def steps(self, max_steps: int) -> Iterator[int]:
        """Yield the steps still to do, ``resumed_from + 1 .. max_steps``; stop cleanly on a signal."""
        for step in range(self.step + 1, max_steps + 1):
            self._boundary()
            yield step
            self.step = step
            if self.heartbeat is not None:
                self.heartbeat.post(step=step, max_steps=max_steps, resumed_from=self.resumed_from or 0,
                                    **(self.auto_save.fields() if self.auto_save else {}), **self._fields)
            if self._save_due(step) and step < max_steps:
                self._save(background=True)

    def _save_due(self, step: int) -> bool:
        if self.auto_save is not None:
            if self.sharded:  # a collective save: all ranks take one decision (any rank's), or they hang
                return any_rank(self.auto_save.due())
            return self.run.is_writer and self.auto_save.due()  # only rank 0 writes: no need to agree
        return bool(self.save_every) and step % self.save_every == 0

    def tolerant(self, fn: Callable[..., Any], name: str | None = None) -> Callable[..., Any]:
        """``fn`` (a tracker's call: ``wandb.log``, ``mlflow.log_metrics``, a writer's ``add_scalar``) as it is,
        except that once a stop's signal came its failure is noted in the stop's report and it returns None:
        the signal that stops the job may have ended the tracker's own helper process (W&B's service on Slurm),
        and the stop must still reach its checkpoint."""
        return self.tolerance.wrap(fn, name or getattr(fn, "__qualname__", None) or repr(fn))

    def log(self, **fields: Any) -> None:
        """Numbers to show in ``attempts/<n>/progress.json`` with the next step (e.g. ``loss=``)."""
        self._fields = {k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in fields.items()}

    def _boundary(self) -> None:
        """Between two steps: the only place a signal is acted on (the state is one completed step)."""
        self.ckpts.poll()  # a failed background save surfaces here, not silently at the end
        if self.agreement.should_stop():
            self._stop()

    def _stop(self) -> None:
        """Checkpoint the last completed step, record the stop's step, exit 143."""
        path = self._save(background=False)
        self._stopped = True
        self.flag.record_step(self.step)
        raise self.run.preempted(self.step, signal_name(self.flag.signum or self.agreement.signum), path,
                                 self.tolerance.report())

    def _save(self, background: bool) -> Path | None:
        if self.step == 0 or self.step == self._saved_step:
            committed = self.ckpts.wait()  # e.g. the periodic save of this very step is in flight
            return committed[1] if committed and committed[0] == self.step else self._saved_path
        if self.sharded:
            # Collective: every rank writes its part, rank 0 commits once all reported (or none does).
            self._saved_step = self.step
            t0 = time.monotonic()
            self._saved_path = self.sckpts.save(
                self.step, sharded=self._sharded_state(), per_rank={"rng.pt": capture_rng()},
                replicated={"state.pt": dict(self.state), "meta.json": {"step": self.step},
                            **({"sched.pt": self.scheduler.state_dict()} if self.scheduler is not None else {})})
            if self.auto_save is not None:  # a sharded save blocks the loop for all of it
                self.auto_save.record_save(time.monotonic() - t0, time.monotonic() - t0)
            return self._saved_path
        files: dict[str, Any] = {"model.pt": self.model.state_dict(), "rng.pt": capture_rng(),
                                 "state.pt": dict(self.state), "meta.json": {"step": self.step}}
        if self.optimizer is not None:
            files["optim.pt"] = self.optimizer.state_dict()
        if self.scheduler is not None:
            files["sched.pt"] = self.scheduler.state_dict()
        self._saved_step = self.step
        if not self.run.is_writer:
            return None
        t0 = time.monotonic()
        self._saved_path = self.ckpts.save(self.step, files, background=background)  # prunes after commit
        if self.auto_save is not None:  # what the loop waited is the cost the interval weighs
            self.auto_save.record_save(time.monotonic() - t0, self.ckpts.last_save_s)
        return self._saved_path

    # --- leaving: the marker, or nothing -----------------------------------------------------------
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        try:
            if exc_type is None:
                if self.agreement.agree():
                    # A stop is never completion: the last step is checkpointed and the next
                    # attempt, with 0 steps left, only writes the result.
                    log(f"{signal_name(self.flag.signum)} during the last step: stopping, not finishing")
                    self._stop()
                # The final step committed before completion is recorded: an exception after training (a
                # failed export), fixed and requeued, resumes at the end, 0 steps retrained (it redid up to
                # save_every). Collective where saves are: every rank gets here.
                self._save(background=False)
                if self.run.is_writer:
                    self.run.result_dir.mkdir(parents=True, exist_ok=True)
                    torch.save(self.model.state_dict(), self.run.result_dir / "model.pt")
                    self.run.finish({"step": self.step, "resumed_from": self.resumed_from, **self._fields},
                                    step=self.step)
                # Every rank leaves together, once the completion is recorded: a rank that went on to tear
                # down its process group while rank 0 still wrote aborted now and then after a resume
                # ("terminate called without an active exception", exit -6: the attempt was a crash).
                barrier()
            elif not self._stopped and not issubclass(exc_type, SystemExit | KeyboardInterrupt):
                try:
                    self.ckpts.wait()  # an in-flight save still commits: the next attempt loses less
                except Exception as e:  # the original error is the one to report
                    log(f"background save failed too: {e!r}")
                self.run.crashed(self.step, exc, rank=self.sckpts.rank, world=self.sckpts.world)
        finally:
            if self.heartbeat is not None:
                self.heartbeat.stop()
            self.flag.uninstall()
            settle()  # the program may exit right after: no collective of ours may be freed during finalization
        return False


def orch_run(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
             **kwargs: Any) -> OrchRun:
    """``with orch_run(model, optimizer, scheduler, save_every=100, keep_last_k=2, state=None) as run:``.

    See the module docstring; ``run_dir=`` when not run by orch.
    """
    return OrchRun(model, optimizer, scheduler, **kwargs)
