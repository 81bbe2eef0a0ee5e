"""Hugging Face ``Trainer``: orch's guarantees through one ``TrainerCallback`` and ``resume_from_checkpoint``.

::

    from orchestrator.integrations import hf as orch                          # 1
    trainer = Trainer(..., callbacks=[orch.OrchCallback()])                    # 2
    trainer.train(resume_from_checkpoint=orch.resume_path())                  # 3

What it does, with the public ``TrainerCallback`` API only:

* SIGTERM / SIGUSR2 set a flag; at the next ``on_step_end`` (an optimizer step just completed) the callback
  sets ``control.should_save`` and ``control.should_training_stop``: HF saves ``checkpoint-N`` of that step
  and leaves its loop; ``train()`` then raises ``SystemExit(143)`` from ``on_train_end`` with
  ``failure.json`` = ``preempted``. Every such signal, whoever sent it, is recorded in
  ``attempts/<n>/stop.json``: orch never verifies that attempt, whatever the exit code.
  ``enable_jit_checkpoint``: HF installs its SIGTERM handler in ``Trainer.__init__`` (its
  ``JITCheckpointCallback.set_trainer``) and exits 0 after its save; this callback's handler replaces it
  at ``on_init_end`` (so the stop is recorded and the save happens at the next step boundary), and is
  not replaced by JIT's again at train end.
* several ranks (``orch submit --nproc-per-node K``, or torchrun; HF's own DDP): every rank takes the same stop
  decision at the same step (the kit's ``StopAgreement``, one all-reduce), whichever rank got the signal. An
  evaluation inside ``train()`` is a stop point too: the ranks agree when it ends (HF's evaluation loop has no
  exit a callback can take, so a long evaluation still runs to its end) and HF saves the evaluated step
  (not with ``save_strategy="best"``, which overrides that save: the stop waits for the next step there).
  The ranks agree once more at ``on_train_end``: a signal to one rank after the last step stops every rank.
* every ``checkpoint-N`` HF writes (on a signal or by ``save_steps``) is committed in ``on_save`` as
  ``<run dir>/checkpoints/step-<N>``: moved out of ``output_dir`` (so ``output_dir`` holds no
  ``checkpoint-N`` once a save completed), each file fsynced and hashed, ``manifest.json`` last, renamed
  into place, by rank 0 once every rank is in ``on_save`` (the other ranks' ``rng_state_<rank>.pth`` are in
  ``checkpoint-N`` then). The newest ``keep_last_k`` are kept; it defaults to ``TrainingArguments.save_total_limit``
  (HF's rotation never sees the moved dirs, so the callback applies it), and keeps all when that is None.
  HF writes in place without fsync, so a kill -9 mid-save leaves a ``checkpoint-N`` that
  ``resume_from_checkpoint=True`` would pick and crash on, at every requeue.
  ``resume_path()`` only returns a verified ``step-N`` (HF loads it like any checkpoint dir); a
  ``checkpoint-N`` found in ``output_dir`` at the start of training is unfinished and renamed aside.
* when training ends normally: ``result/`` (``save_pretrained`` of the model, ``metrics.json``), then
  training is recorded complete (``attempts/<n>/complete.json``); orch writes ``done.json`` only after the
  script exits 0, listing everything under ``result/`` then (an exception after ``train()`` is a crash).
  Without orch: ``done.json`` at train end. A signal after the last step is a stop (exit 143), never
  completion.
* trackers: ``report_to="tensorboard"`` logs to the run's one TensorBoard dir for every attempt (the
  callback sets ``TENSORBOARD_LOGGING_DIR`` when constructed, unless set); ``report_to="wandb"`` continues
  one W&B run through orch's ``WANDB_RUN_ID``/``WANDB_RESUME=allow``.

Limits: ``load_best_model_at_end`` (HF remembers the best checkpoint by its ``output_dir`` path, which
this callback moves) and ``save_only_model=True`` (no optimizer state to resume) are not supported.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import CallbackHandler
from transformers.trainer_utils import SaveStrategy

from orchestrator import protocol
from orchestrator.kit import heartbeat, stall
from orchestrator.kit.commit import clean_stale, commit_checkpoint
from orchestrator.kit.dist import StopAgreement, any_rank, barrier
from orchestrator.kit.heartbeat import Heartbeat
from orchestrator.kit.interval import AutoSaveInterval
from orchestrator.kit.log import log
from orchestrator.kit.preemption import PreemptionFlag
from orchestrator.kit.run import Run, signal_name
from orchestrator.kit.trackers import StopTolerance
from orchestrator.kit.wandbstep import StepNumberedModule

_HF_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def _trainer_calling(frame: Any) -> object:
    """The ``Trainer`` whose training loop called the callback handler that called this hook: the nearest frame up
    whose ``self`` has a ``_run_epoch`` (no hook is given the trainer)."""
    f = frame
    for _ in range(6):
        f = f.f_back
        if f is None:
            return None
        obj = f.f_locals.get("self")
        if obj is not None and hasattr(obj, "_run_epoch") and hasattr(obj, "callback_handler"):
            return obj
    return None


def resume_path(run_dir: str | os.PathLike[str] | None = None) -> str | None:
    """The ``resume_from_checkpoint`` value: the newest verified ``checkpoints/step-N`` dir, or None."""
    found = Run.from_env(run_dir).resume_checkpoint()
    return str(found[1]) if found is not None else None


class OrchCallback(TrainerCallback):
    """Save and stop at the next step on SIGTERM/SIGUSR2, commit every HF checkpoint, mark a normal end.

    ``keep_last_k``: committed checkpoints kept under ``<run dir>/checkpoints/``; default (None): HF's
    ``save_total_limit`` (all when that is None too). HF's own rotation no longer sees them.
    """

    def __init__(self, keep_last_k: int | None = None, run_dir: str | os.PathLike[str] | None = None,
                 save_every: str | None = None) -> None:
        self.run = Run.from_env(run_dir)
        # save_every="auto": also save at Daly's interval for the measured save cost and orch's ORCH_MTBF_S
        self.auto_save = AutoSaveInterval() if save_every == "auto" else None
        self.keep_last_k = keep_last_k
        self.flag = PreemptionFlag()
        self.agreement = StopAgreement(self.flag)  # one decision for every rank, at a bounded cost
        self._installed = False
        self._heartbeat: Heartbeat | None = None
        self._stopping = False
        self._in_train = False  # trainer.evaluate() outside train(), maybe on one rank only: no agreement there
        self._committed: Path | None = None
        self._skipping: Any = None  # a Trainer resumed at max_steps whose epochs this train() skips
        self._resumed_from = 0  # global_step after HF's restore: `orch metrics` counts steps redone
        # The other callbacks (report_to's W&B, MLflow, ...): a failure during a stop must not cost its save.
        self.tolerance = StopTolerance(lambda: self.flag.requested or self._stopping)
        # HF's TensorBoardCallback reads this when the Trainer is built (after this constructor); without
        # it every attempt logs to a new output_dir/runs/<date>_<host> dir: one curve per attempt.
        os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(self.run.tensorboard_dir))

    def _report_storage_faults(self, state: TrainerState, rank: int, world: int) -> None:
        """An OSError of the storage that leaves the script (HF's own checkpoint write: EIO, ESTALE, a full disk)
        is recorded with its class, storage or enospc, before Python prints it (one EIO was a counted
        crash). No HF hook sees a failed save: this is the script's excepthook, chained to the one it had."""
        if getattr(sys.excepthook, "orch_storage_report", False):
            return
        previous = sys.excepthook

        def hook(tp: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            if protocol.write_error_class(exc) != "crash":
                with contextlib.suppress(Exception):  # the report is best effort; the traceback is printed anyway
                    self.run.crashed(state.global_step, exc, rank=rank, world=world)
            previous(tp, exc, tb)

        hook.orch_storage_report = True  # type: ignore[attr-defined]
        sys.excepthook = hook

    # --- start -------------------------------------------------------------------------------------
    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        if not self._installed:  # from now on a signal ends as a clean preemption, not a bare kill
            self.flag.install()
            self._installed = True

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self.run.is_writer = state.is_world_process_zero
        if self.run.already_complete():
            raise SystemExit(protocol.EXIT_OK)
        if getattr(args, "enable_jit_checkpoint", False):
            log("enable_jit_checkpoint is on: its SIGTERM handler exits 0 after saving; orch's handler takes over")
        if args.save_only_model:
            log("save_only_model=True: checkpoints hold no optimizer state, a resume is not exact")
        self.on_init_end(args, state, control)
        self._tolerate_the_other_callbacks(sys._getframe(1).f_locals.get("self"))
        if state.max_steps and state.global_step >= state.max_steps:
            self._train_nothing_more(_trainer_calling(sys._getframe(1)))
        self._in_train = True
        self.run.begin()
        self._report_storage_faults(state, args.process_index, args.world_size)
        if self.run.is_writer:
            clean_stale(self.run.run_dir)
            self._set_aside_unfinished(Path(args.output_dir))
        # HF loaded the checkpoint's TrainerState before this callback: global_step is the resume step.
        self._resumed_from = state.global_step
        self.run.resumed(state.global_step)  # ORCH_RESUME_STEP; TensorBoard hides a killed attempt's later points
        # Every rank beats (rank 0 progress.json, the others their own file): a hung rank 1 is seen as such.
        self._heartbeat = heartbeat.for_rank(self.run.run_dir, self.run.attempt, self.run.heartbeat_s,
                                             writer=self.run.is_writer, rank=args.process_index,
                                             world=args.world_size)
        if self._heartbeat is not None:
            self._heartbeat.post(step=state.global_step, max_steps=state.max_steps, resumed_from=state.global_step)
            self._heartbeat.write_now()
        if self.auto_save is not None:  # δ from the previous attempt; the interval from the loop's start
            self.auto_save.resume_from(self.run.run_dir, self.run.attempt)

    def _tolerate_the_other_callbacks(self, handler: object) -> None:
        """Every other callback's events become stop-tolerant (``trackers``). ``handler``: the caller of this
        event, HF's ``CallbackHandler`` (no event is given the trainer or its callbacks)."""
        if not isinstance(handler, CallbackHandler):
            log("the callbacks' caller is not HF's CallbackHandler: a tracker that fails during a stop may cost "
                "its checkpoint")
            return
        events = tuple(n for n in vars(TrainerCallback) if n.startswith("on_"))
        for callback in handler.callbacks:
            if callback is not self:
                self.tolerance.wrap_methods(callback, events)
            # report_to="wandb": its rows logged with step= the global step (kit/wandbstep.py says why)
            if type(callback).__name__ == "WandbCallback" and getattr(callback, "_wandb", None) is not None \
                    and not isinstance(callback._wandb, StepNumberedModule):
                callback._wandb = StepNumberedModule(callback._wandb, "train/global_step")

    def _train_nothing_more(self, trainer: object) -> None:
        """A train() resumed at its last step (a stop in that step, or a requeue after a failed export): HF's
        epoch loop checks max_steps only after a step, and trained one more. Its epochs are skipped for
        this call, so that the training ends as it should: on_train_end records completion, the script's code
        after train() runs."""
        run_epoch = getattr(trainer, "_run_epoch", None)
        if not callable(run_epoch):
            log("resumed at max_steps, but this Trainer has no _run_epoch to skip: HF may train one step more")
            return
        log("resumed at max_steps: nothing left to train")
        trainer._run_epoch = lambda *_a, **_k: None  # type: ignore[attr-defined]  # this instance, this call
        self._skipping = trainer

    def _set_aside_unfinished(self, output_dir: Path) -> None:
        """Rename ``checkpoint-N`` dirs left in ``output_dir``: a save that never reached ``on_save``.

        Every save that completed was moved out by ``on_save``; what is left was cut by a kill (seed 002's
        torn newest checkpoint). Renamed, not deleted: it may be someone's own; HF ignores the new name.
        """
        if not output_dir.is_dir():
            return
        for p in output_dir.iterdir():
            if _HF_CHECKPOINT_RE.match(p.name) and p.is_dir() and not p.is_symlink():
                dest = p.with_name(f"{p.name}.incomplete-{os.urandom(4).hex()}")
                os.rename(p, dest)
                log(f"{p} was never committed (a save cut short): renamed to {dest.name}, not used")

    # --- each optimizer step -----------------------------------------------------------------------
    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl:
        if self._heartbeat is not None:
            self._heartbeat.post(step=state.global_step, max_steps=state.max_steps, resumed_from=self._resumed_from,
                                 **(self.auto_save.fields() if self.auto_save else {}), **self._last_loss(state))
        if self.agreement.should_stop():
            self._stop_here(state, control)
            # HF evaluates before it saves: a full evaluation must not stand between the signal and the save.
            control.should_evaluate = False
        if self.auto_save is not None and any_rank(self.auto_save.due()):  # every rank the same decision
            control.should_save = True
        if state.max_steps and state.global_step >= state.max_steps:
            # The final step committed before completion is recorded: an exception after train() (a
            # failed export), fixed and requeued, resumes at the end, 0 steps retrained (it retrained all of them).
            control.should_save = True
        # HF saves after this hook when should_save is set; on_save adds its duration to save_stall_s.
        self._save_began = time.monotonic() if control.should_save else None
        return control

    def _stop_here(self, state: TrainerState, control: TrainerControl) -> None:
        """HF saves ``checkpoint-<global_step>`` right after this hook and then leaves its training loop."""
        control.should_save = True
        control.should_training_stop = True
        self._stopping = True
        self.flag.record_step(state.global_step)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl:
        """An evaluation inside ``train()`` is a stop point too: every rank runs it, HF saves right after it.

        A signal during an evaluation waited for the next step agreement, up to a second of steps later
        (step 18 for an evaluation at step 10). HF's evaluation loop has no exit a callback can take, so the ranks
        agree when it ends; the step saved is the evaluated one, with the RNG after the evaluation's draw.
        """
        # save_strategy="best": HF sets should_save after this hook, to "a new best metric": the stop's save could
        # be dropped. The stop then waits for the next step's agreement (same args on every rank: none agrees here).
        if self._in_train and not self._stopping and args.save_strategy != SaveStrategy.BEST \
                and self.agreement.agree():
            self._stop_here(state, control)
        return control

    @staticmethod
    def _last_loss(state: TrainerState) -> dict[str, float]:
        for entry in reversed(state.log_history[-3:]):
            if "loss" in entry:
                return {"loss": float(entry["loss"])}
        return {}

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        """Every rank: wait until all ranks wrote their files; then rank 0 commits ``checkpoint-N``."""
        # HF's _save_checkpoint has no barrier between the ranks' writes and on_save: rank 0 moved checkpoint-N
        # while a slower rank 1 had yet to write its rng_state_1.pth into it (that rank crashed on the
        # vanished dir, and the step committed without its RNG). The kit's barrier: a no-op on one rank.
        barrier()
        began = getattr(self, "_save_began", None)
        if began is not None:
            stall.add(time.monotonic() - began)  # HF's own write blocked the loop (goodput)
            self._save_began = None
        if self.run.is_writer:
            # No second barrier: no rank can end its attempt before this commit, HF's store_flos after the
            # loop is a collective (and DDP's next backward is one).
            self._commit(args, state)
        if self.auto_save is not None and began is not None:  # HF's write and the commit: the save's cost
            self.auto_save.record_save(time.monotonic() - began)

    def _commit(self, args: TrainingArguments, state: TrainerState) -> None:
        src = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not src.is_dir():
            log(f"on_save: {src} not found; nothing to commit")
            return
        # A fixed keep of 2 ignored save_total_limit=5 (and None: keep every one).
        keep = self.keep_last_k if self.keep_last_k is not None else args.save_total_limit
        self._committed = commit_checkpoint(self.run.run_dir, state.global_step, move_from=src,
                                            keep_last_k=keep)

    # --- the end -----------------------------------------------------------------------------------
    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        # Every rank the same answer: on its own flag, rank 0 recorded completion while rank 1, signalled
        # after the last step's agreement, exited 143. Every rank gets here after HF's store_flos collective.
        stop = self._stopping or self.agreement.agree()
        self._close()
        if stop:
            # A stop is never completion, also when it came with the last step.
            self.flag.record_step(state.global_step)
            raise self.run.preempted(state.global_step, signal_name(self.flag.signum or self.agreement.signum),
                                     self._committed, self.tolerance.report())
        if self.run.is_writer:
            self._save_result(model)
            last = next((e for e in reversed(state.log_history) if "train_loss" in e or "loss" in e), {})
            self.run.finish({"global_step": state.global_step, "epoch": state.epoch, **last},
                            step=state.global_step)

    def _save_result(self, model: torch.nn.Module | None) -> None:
        out = self.run.result_dir
        out.mkdir(parents=True, exist_ok=True)
        if model is None:
            return
        if hasattr(model, "save_pretrained"):
            model.save_pretrained(out)
        else:
            torch.save(model.state_dict(), out / "model.pt")

    def _close(self) -> None:
        self._in_train = False
        if self._skipping is not None:  # the class's own _run_epoch again, for a later train()
            with contextlib.suppress(AttributeError):
                del self._skipping._run_epoch
            self._skipping = None
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        self.flag.uninstall()
        self._installed = False
