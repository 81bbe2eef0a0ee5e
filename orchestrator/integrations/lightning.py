"""Lightning: orch's guarantees through one callback and Lightning's own ``ckpt_path``.

::

    from orchestrator.integrations import lightning as orch                                    # 1
    trainer = L.Trainer(..., callbacks=[orch.OrchCallback()], logger=orch.tensorboard_logger())  # 2
    trainer.fit(model, train_loader, ckpt_path=orch.resume_path())                              # 3

What it does, with public Lightning API only (``Callback`` hooks, ``Trainer.save_checkpoint``,
``fit(ckpt_path=...)``, ``Strategy.reduce_boolean_decision``; the ranks' stop agreement is the kit's, over the
process group Lightning's strategy set up):

* SIGTERM / SIGUSR2 set a flag. At the next ``on_train_batch_end`` that closes an optimizer step (or the next
  validation batch end, when the signal comes during the validation inside ``fit``), the
  callback saves with ``trainer.save_checkpoint`` into ``checkpoints/step-<N>.tmp-*/model.ckpt`` and
  commits it in orch's format (fsynced, hashed, manifest last, renamed into place); the step's metrics
  are still logged, then the next hook raises ``SystemExit(143)`` with ``failure.json`` = ``preempted``.
  Lightning's own SIGTERM handling stops the loop and exits **0** (``SIGTERMException``); the callback
  takes over SIGTERM once training starts, and turns a ``SIGTERMException`` that still happens (a signal
  during the sanity check) into exit 143: a signalled attempt never ends with a done marker.
* ``resume_path()`` is the newest *verified* checkpoint's ``model.ckpt`` (or None): Lightning's own restore
  path (loops, optimizers, schedulers, callbacks). The callback adds the global RNG states to the
  checkpoint and restores them, so dropout continues exactly. Data order continues exactly only if the
  train dataloader is resumable (``state_dict``/``load_state_dict``, e.g. torchdata's
  ``StatefulDataLoader``): with a plain ``DataLoader`` Lightning restarts the interrupted epoch's iterator
  (its own warning says so) — 0 optimizer steps redone, but other batches. Under DDP its sampler must be
  ``distributed_sampler(ds)`` too (why: there).
* Every stop signal, whoever sent it, is recorded in ``attempts/<n>/stop.json`` (with the step it was acted
  on): orch never verifies such an attempt, whatever the exit code. A signal after the last step is a stop
  too: that step is checkpointed, exit 143, and the next attempt (0 steps left) writes the result.
* When ``fit`` ends normally (max_steps/max_epochs, early stopping): ``result/model.ckpt`` (weights) and
  ``result/metrics.json``, then training is recorded complete (``attempts/<n>/complete.json``); orch writes
  ``done.json`` only after the script exits 0, listing everything under ``result/`` then (an exception
  after ``fit``, e.g. in an export, is a crash). Without orch: ``done.json`` when ``fit`` ends.
* ``tensorboard_logger()`` logs to the run's one TensorBoard dir for every attempt (Lightning's default
  logger starts a new ``version_N`` dir each time); ``WandbLogger`` needs nothing: orch's
  ``WANDB_RUN_ID``/``WANDB_RESUME=allow`` make every attempt continue one W&B run; ``mlflow_logger()`` logs into
  the job's one MLflow run (docs/trackers.md).
"""

from __future__ import annotations

import os
import signal
import time
import weakref
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from orchestrator import protocol
from orchestrator.kit import heartbeat
from orchestrator.kit.commit import clean_stale, commit_checkpoint
from orchestrator.kit.dist import StopAgreement
from orchestrator.kit.heartbeat import Heartbeat
from orchestrator.kit.interval import AutoSaveInterval
from orchestrator.kit.log import log
from orchestrator.kit.preemption import DEFAULT_SIGNALS, PreemptionFlag
from orchestrator.kit.rng import capture_rng, restore_rng
from orchestrator.kit.run import Run, signal_name
from orchestrator.kit.trackers import StopTolerance

CKPT_FILE = "model.ckpt"


def resume_path(run_dir: str | os.PathLike[str] | None = None) -> str | None:
    """The ``ckpt_path`` to pass to ``Trainer.fit``: the newest verified checkpoint's ``model.ckpt``, or None."""
    found = Run.from_env(run_dir).resume_checkpoint()
    if found is None:
        return None
    path = found[1] / CKPT_FILE
    return str(path) if path.is_file() else None


def tensorboard_logger(run_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> Any:
    """A ``TensorBoardLogger`` writing straight into the run's TensorBoard dir, the same for every attempt."""
    from lightning.pytorch.loggers import TensorBoardLogger

    return TensorBoardLogger(save_dir=str(Run.from_env(run_dir).tensorboard_dir), name="", version="", **kwargs)


def mlflow_logger(**kwargs: Any) -> Any:
    """An ``MLFlowLogger`` that logs into the job's one MLflow run: orch's wrapper passes its id as
    ``MLFLOW_RUN_ID``, which Lightning's logger does not read, and it creates its experiment's run before any
    callback's hook could hand it over. Without orch (no ``MLFLOW_RUN_ID``), or given ``run_id=``, a plain one."""
    from lightning.pytorch.loggers import MLFlowLogger

    kwargs.setdefault("run_id", os.environ.get("MLFLOW_RUN_ID"))
    return MLFlowLogger(**kwargs)


# The samplers made by distributed_sampler() in this process: the callback gives them the restored epoch.
_SAMPLERS: weakref.WeakSet[Any] = weakref.WeakSet()


def distributed_sampler(dataset: Any, seed: int = 0, shuffle: bool = True, drop_last: bool = False) -> Any:
    """A ``DistributedSampler`` for this rank (from torchrun's ``WORLD_SIZE``/``RANK``; one process: the whole
    dataset) whose epoch the callback restores before Lightning builds the resumed iterator.

    Why: under DDP, Lightning wraps a loader's own shuffling sampler (``DistributedSamplerWrapper``), whose
    permutation is drawn from the global RNG when the epoch's iterator is made, before any restore: a resumed
    attempt saw none of the uninterrupted run's batches. A plain ``DistributedSampler`` orders by seed and epoch,
    but Lightning makes the resumed iterator before it sets the epoch: an attempt resumed in epoch 1 replayed epoch
    0's order. Pass it as ``StatefulDataLoader(ds, batch_size=..., sampler=orch.distributed_sampler(ds))``.
    """
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(dataset, num_replicas=int(os.environ.get("WORLD_SIZE", "1")),
                                 rank=int(os.environ.get("RANK", "0")), shuffle=shuffle, seed=seed,
                                 drop_last=drop_last)
    _SAMPLERS.add(sampler)
    return sampler


def _validation_follows(trainer: pl.Trainer) -> bool:
    """Whether Lightning runs validation right after the current optimizer step's batch.

    Lightning's own predicate (the one its training loop asks next); it has no public equivalent. Without
    it (another Lightning version) the answer is False: the stop is taken at the batch end as before,
    still with 0 steps redone, only not bit-exact across that validation.
    """
    loop = getattr(trainer.fit_loop, "epoch_loop", None)
    should = getattr(loop, "_should_check_val_fx", None)
    if should is None or getattr(loop, "_skip_next_val", False):
        return False
    try:
        return bool(should(trainer.fit_loop._data_fetcher))
    except Exception:  # a changed private signature: fall back to the batch-end stop
        return False


def _number_wandb_rows_by_step(logger: Any) -> None:
    """A ``WandbLogger``'s rows logged with ``step=`` the trainer's global step (kit/wandbstep.py says why: after a
    kill -9 its curve went back at the resume). Lightning's own ``log_metrics`` gives W&B no step."""
    try:
        from lightning.fabric.utilities.logger import _add_prefix
    except ImportError:  # another Lightning: its rows stay numbered by W&B
        log("WandbLogger: this Lightning has no _add_prefix; W&B numbers its rows (steps trained again show twice)")
        return
    original = logger.log_metrics

    def log_metrics(metrics: Any, step: int | None = None) -> None:
        if step is None or logger._wandb_init.get("sync_tensorboard"):
            return original(metrics, step)
        row = dict(_add_prefix(metrics, logger._prefix, logger.LOGGER_JOIN_CHAR), **{"trainer/global_step": step})
        return logger.experiment.log(row, step=step)

    logger.log_metrics = log_metrics


# What Lightning calls on a logger during fit (the logger connector, ModelCheckpoint, teardown).
_LOGGER_CALLS = ("log_metrics", "log_hyperparams", "log_graph", "save", "finalize", "after_save_checkpoint")


class OrchCallback(Callback):
    """Checkpoint on SIGTERM/SIGUSR2 at a step boundary, exit 143; done marker after a normal ``fit``.

    ``every_n_steps``: also commit a checkpoint every N optimizer steps (protection from kill -9 and node
    failures; a signal needs none). ``keep_last_k``: committed checkpoints kept.
    """

    def __init__(self, every_n_steps: int | str | None = None, keep_last_k: int = 2,
                 run_dir: str | os.PathLike[str] | None = None) -> None:
        self.every_n_steps = every_n_steps
        self.keep_last_k = keep_last_k
        self._run_dir_arg = run_dir
        self.flag = PreemptionFlag()
        # One decision for every rank, at a bounded cost: an all-reduce every N steps, N chosen so that it
        # stays under 1 % of the step time (kit/dist.py); a signal to one rank stops all after the same step.
        self.agreement = StopAgreement(self.flag)
        self._heartbeat: Heartbeat | None = None
        self._last_step: int | None = None  # global_step at the previous batch end
        self._resumed_from = 0  # global_step after Lightning's restore: `orch metrics` counts steps redone
        self._saved: tuple[int, Path] | None = None
        self._stop: SystemExit | None = None
        self._stop_noted = 0  # tracker failures named in the stop's report
        self._completed = False  # the completion recorded (on_train_end, or on_fit_end for a fit restored at its end)
        self._stop_pending: int | None = None  # a stop decided at this step, taken when its validation starts
        self._save_pending: tuple[int, bool] | None = None  # a periodic save (step, timed), taken there too
        self._pending_rng: dict[str, Any] | None = None
        # The loggers (W&B, MLflow, ...): one that fails between a signal and the stop's save must not cost it.
        self.tolerance = StopTolerance(
            lambda: self.flag.requested or self._stop is not None or self._stop_pending is not None)
        # every_n_steps="auto": Daly's interval for the measured save cost and orch's ORCH_MTBF_S (kit/interval.py)
        self.auto_save = AutoSaveInterval() if every_n_steps == "auto" else None

    @property
    def state_key(self) -> str:
        return "OrchCallback"

    # --- start -------------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.run = Run.from_env(self._run_dir_arg)
        self._trainer = trainer
        self.run.is_writer = trainer.is_global_zero
        if self.run.already_complete():
            raise SystemExit(protocol.EXIT_OK)
        # Now rather than at on_train_start: a signal during the checkpoint restore or the sanity check
        # must count too (Lightning composes this handler into its own until training starts).
        self.flag.install()
        for logger in trainer.loggers:
            if trainer.is_global_zero and type(logger).__name__ == "WandbLogger":
                _number_wandb_rows_by_step(logger)
            self.tolerance.wrap_methods(logger, _LOGGER_CALLS)
        self.run.begin()
        if self.run.is_writer:
            clean_stale(self.run.run_dir)
        # Every rank beats (rank 0 progress.json, the others their own file): a hung rank 1 is seen as such.
        self._heartbeat = heartbeat.for_rank(self.run.run_dir, self.run.attempt, self.run.heartbeat_s,
                                             writer=self.run.is_writer, rank=trainer.global_rank,
                                             world=trainer.world_size)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning installed its SIGTERM handler just before training (it stops the loop and exits 0);
        # from here on only ours runs. Lightning's teardown restores the handlers it found before fit.
        for s in DEFAULT_SIGNALS:
            signal.signal(s, self.flag._handle)  # the flag's own handler: it records the stop (stop.json)
        self._last_step = self._resumed_from = trainer.global_step
        # ORCH_RESUME_STEP; TensorBoard hides a killed attempt's later points. Lightning's loggers number a step's
        # metrics from 0 (global_step before the step): the first this attempt logs is the resume step itself.
        self.run.resumed(trainer.global_step, first_logged_step=trainer.global_step)
        if self.auto_save is not None:  # δ from the previous attempt; the interval from the loop's start
            self.auto_save.resume_from(self.run.run_dir, self.run.attempt)
        if self._heartbeat is not None:  # the attempt's first heartbeat names the resume step at once
            self._heartbeat.post(step=self._resumed_from, resumed_from=self._resumed_from)
            self._heartbeat.write_now()

    # --- resume ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        # Called inside every trainer.save_checkpoint: the RNG at the step boundary being saved, and the epoch.
        trainer = getattr(self, "_trainer", None)
        return {"rng": capture_rng(), **({"epoch": trainer.current_epoch} if trainer is not None else {})}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending_rng = state_dict.get("rng")
        epoch = state_dict.get("epoch")
        if isinstance(epoch, int):  # before fit's loop makes the resumed iterator (see distributed_sampler)
            for sampler in list(_SAMPLERS):
                sampler.set_epoch(epoch)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._take_pending_stop(trainer)
        self._raise_if_stopping()
        if self._pending_rng is not None:
            # Restored here, right before the first training_step, not at load time: the sanity check
            # and the dataloader's iter() run in between and would consume it.
            restore_rng(self._pending_rng)
            self._pending_rng = None

    # --- each optimizer step -----------------------------------------------------------------------
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step == self._last_step:
            return  # mid gradient accumulation: the accumulated gradients are in no checkpoint
        self._last_step = step
        if self._heartbeat is not None:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            self._heartbeat.post(step=step, resumed_from=self._resumed_from,
                                 **(self.auto_save.fields() if self.auto_save else {}),
                                 **({"loss": float(loss)} if loss is not None else {}))
        stop = self.agreement.should_stop()
        # Every rank the same choice (a time-based val_check_interval could differ): save_checkpoint is collective.
        if stop and trainer.strategy.reduce_boolean_decision(_validation_follows(trainer), all=True):
            # The uninterrupted run's validation draws from the global RNG (the val loader's iter() seeds
            # itself) before the next step's dropout: saved here, the RNG would miss that draw and the
            # resumed run would not be bit-exact. Taken at on_validation_start, after the draw; the
            # weights are the same (no optimizer step in between).
            self._stop_pending = step
        elif stop:
            self._stop_at(trainer, step)
        elif self.auto_save is not None:
            # every rank the same answer: save_checkpoint is collective (a rank that alone saved would hang)
            if trainer.strategy.reduce_boolean_decision(self.auto_save.due(), all=False):
                self._periodic_save(trainer, step, timed=True)
        elif self.every_n_steps and step % self.every_n_steps == 0:
            self._periodic_save(trainer, step, timed=False)

    def _periodic_save(self, trainer: pl.Trainer, step: int, timed: bool) -> None:
        """A save on orch's interval; deferred to the validation's start when one follows this step, as a stop's is:
        resumed from a checkpoint saved before that validation's RNG draw, a job killed -9 later trained the steps
        after it again with other dropout (a tracker test found it: Lightning, validation after every step)."""
        if trainer.strategy.reduce_boolean_decision(_validation_follows(trainer), all=True):
            self._save_pending = (step, timed)
        else:
            self._periodic_save_now(trainer, step, timed)

    def _periodic_save_now(self, trainer: pl.Trainer, step: int, timed: bool) -> None:
        t0 = time.monotonic()
        self._save(trainer, step)
        if timed and self.auto_save is not None:
            self.auto_save.record_save(time.monotonic() - t0)

    def _stop_at(self, trainer: pl.Trainer, step: int) -> None:
        """Checkpoint ``step``, record the stop's step; the next hook raises exit 143."""
        path = self._save(trainer, step)
        self.flag.record_step(step)
        self._report_stop(step, path)

    def _report_stop(self, step: int, path: Path) -> None:
        """The stop's report (exit 143 once raised), naming the tracker failures skipped so far."""
        self._stop = self.run.preempted(step, signal_name(self.flag.signum or self.agreement.signum), path,
                                        self.tolerance.report())
        self._stop_noted = self.tolerance.count

    def _save(self, trainer: pl.Trainer, step: int) -> Path:
        if self._saved is not None and self._saved[0] == step:
            return self._saved[1]
        if self.run.is_writer:
            path = commit_checkpoint(self.run.run_dir, step, keep_last_k=self.keep_last_k,
                                     write=lambda tmp: trainer.save_checkpoint(tmp / CKPT_FILE))
        else:  # save_checkpoint is collective: every rank calls it; rank 0 writes
            trainer.save_checkpoint(os.devnull)
            path = self.run.run_dir / protocol.CHECKPOINTS_DIR / protocol.checkpoint_name(step)
        trainer.strategy.barrier("orch.commit_checkpoint")
        self._saved = (step, path)
        return path

    def _take_pending_stop(self, trainer: pl.Trainer) -> None:
        """The save and the stop deferred to this validation's start (or, if Lightning skipped it, to the next hook)."""
        if self._save_pending is not None:
            (step, timed), self._save_pending = self._save_pending, None
            self._periodic_save_now(trainer, step, timed)
        if self._stop_pending is not None:
            step, self._stop_pending = self._stop_pending, None
            self._stop_at(trainer, step)

    def _raise_if_stopping(self) -> None:
        """Leave fit with exit 143 once the step's checkpoint is committed and its metrics were logged."""
        if self._stop is not None:
            if self._stop_noted != self.tolerance.count and self._saved is not None:
                # a logger failed after the save (its metrics come after on_train_batch_end): the report says so
                self._report_stop(*self._saved)
            raise self._stop

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._take_pending_stop(trainer)
        self._raise_if_stopping()

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        """A validation batch boundary inside ``fit`` is a stop point too (a SIGTERM during a long
        validation waited for all of it, and then for one more training step, before the save). The model
        is the one after the last optimizer step, so that step is what is checkpointed."""
        if trainer.sanity_checking or self._stop is not None or not hasattr(self, "run"):
            return
        # Every rank runs the same validation batches (DistributedSampler): they agree here as at a step.
        if self.agreement.agree():
            self._stop_at(trainer, trainer.global_step)
            self._raise_if_stopping()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._take_pending_stop(trainer)
        self._raise_if_stopping()

    # --- the end -----------------------------------------------------------------------------------
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._take_pending_stop(trainer)
        self._raise_if_stopping()
        if self.agreement.agree():
            # A signal after the last step's on_train_batch_end: a stop is never completion.
            # The last step is checkpointed; the next attempt (0 steps left) writes the result.
            self._stop_at(trainer, trainer.global_step)
            self._raise_if_stopping()
        # The final step committed before completion is recorded: an exception after fit (a failed
        # export), fixed and requeued, resumes at the end, 0 steps retrained (it retrained all of them).
        self._save(trainer, trainer.global_step)
        self._complete(trainer)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A fit restored at its end (max_steps reached: a stop in the last step, or a requeue after a failed
        export) trains nothing and calls no on_train_end: the completion is recorded here (it exited 0
        with none, and never verified)."""
        if hasattr(self, "run") and not self._completed and self._stop is None:
            self._complete(trainer)

    def _complete(self, trainer: pl.Trainer) -> None:
        """``result/model.ckpt`` (weights), then the completion record: the integration's last write."""
        if self.run.is_writer:
            self.run.result_dir.mkdir(parents=True, exist_ok=True)
        trainer.save_checkpoint(self.run.result_dir / CKPT_FILE, weights_only=True)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 0)() == 1}
        self.run.finish({"global_step": trainer.global_step, "epoch": trainer.current_epoch, **metrics},
                        step=trainer.global_step)
        self._completed = True

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SystemExit) and self.flag.requested and exception is not self._stop:
            # Lightning's SIGTERMException (exit code 0) for a signal that came before on_train_start:
            # no step ran since the checkpoint this attempt resumed from, so that one is the resume point.
            exception.code = protocol.EXIT_PREEMPTED
            if self._stop is None:
                self.flag.record_step(trainer.global_step)
                found = self.run.resume_checkpoint()
                self.run.preempted(trainer.global_step, signal_name(self.flag.signum), found and found[1])
        elif protocol.write_error_class(exception) != "crash":
            # An EIO in a checkpoint write was a counted crash: storage (or enospc) says it may pass.
            self.run.crashed(trainer.global_step, exception, rank=trainer.global_rank, world=trainer.world_size)
        self._close()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._close()

    def _close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        self.flag.uninstall()
