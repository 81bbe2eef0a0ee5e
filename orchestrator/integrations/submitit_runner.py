"""The job side of orch's submitit interop: ``python -m orchestrator.integrations.submitit_runner run ...``.

It loads the ``DelayedSubmission`` (the newest verified checkpoint's, else the original whose sha256 the
command names), installs the stop handlers and calls it; :func:`safe_point` is where a requested stop takes the
callable's ``checkpoint()``. Kept apart from the executor (orchestrator/ops/executor.py, the submitting side,
which also documents the behaviour) because the two run on different machines: this one in the job.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import Any

import submitit.core.utils as submitit_utils

from orchestrator import protocol
from orchestrator.kit.commit import clean_stale, commit_checkpoint
from orchestrator.kit.log import log
from orchestrator.kit.preemption import StopRecorder, attempt_dir_from_env
from orchestrator.kit.run import Run, RunDirError, signal_name

SUBMISSION_DIR = "submitit"  # <run dir>/submitit/submission-*.pkl: the original call (orch never moves it)
CHECKPOINT_FILE = "submission.pkl"  # checkpoints/step-<8 digits>/submission.pkl: what checkpoint() returned
RESULT_FILE = "result.pkl"  # result/result.pkl: the callable's return value, listed in done.json
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
DEFAULT_CHECKPOINT_EVERY_S = 600.0  # executor parameter orch_checkpoint_every_s
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_SUBMITIT_UTILS = submitit_utils.__file__  # DelayedSubmission.result's frame, skipped in crash reports


# =========================================================================================
# job side: the runner and safe_point()
# =========================================================================================
class _StopAttempt(BaseException):
    """Unwinds the callable after its checkpoint committed. A BaseException, so that the callable's own
    ``except Exception`` cannot swallow a stop."""

    def __init__(self, how: str) -> None:
        super().__init__(how)
        self.how = how


class _Unusable(Exception):
    """The original submission is missing or is not the one submitted: no retry can help (``invalid``)."""


_current: _Runner | None = None


def safe_point(step: int | None = None, *, save: bool = False, **progress: Any) -> None:
    """Mark a point between two steps where the callable's state is consistent (``step`` steps complete).

    Under orch's runner: posts ``step`` and ``progress`` (e.g. ``loss=``) to ``attempts/<n>/progress.json``; if a
    stop was requested (SIGTERM/SIGUSR2) it calls the callable's ``checkpoint()``, commits what it returns as
    ``checkpoints/step-<step>`` and ends the attempt (exit 143, ``preempted``) — it does not return then.
    ``save=True`` commits a checkpoint now and carries on (bounds what a kill -9 loses). The first call in an
    attempt also turns off the in-handler fallback: call it once at the top of ``__call__`` to opt in before a
    long set-up. ``step`` must grow across attempts (it names the checkpoint; resume takes the highest).

    Anywhere else — under plain submitit, in a direct call, in a thread other than the main one — a no-op.
    """
    r = _current
    if r is not None and threading.current_thread() is threading.main_thread():
        r.safe_point(step, save, progress)


class _Runner:
    """One attempt of a submitit-style job. Main thread only (it owns the signal handlers)."""

    def __init__(self, run: Run, keep_last_k: int, checkpoint_every_s: float = DEFAULT_CHECKPOINT_EVERY_S) -> None:
        self.run = run
        self.keep_last_k = keep_last_k
        self.checkpoint_every_s = checkpoint_every_s  # 0: no periodic checkpoint
        self.last_commit = time.monotonic()  # of this attempt's newest commit (or its start)
        self.delayed: Any = None  # the DelayedSubmission being run
        self.phase = "loading"  # loading -> calling -> finishing | stopped
        self.signum: int | None = None  # the stop signal, once one came
        self.safe_points = 0
        self.busy = False  # committing a checkpoint: a second signal only sets the flag
        self.step: int | None = None  # the last step safe_point() reported in this attempt
        self.checkpoint: Path | None = None  # the newest committed checkpoint (resumed from, or written)
        self.resumed_from: int | None = None
        self.heartbeat: Any = None
        # Every stop signal, whoever sent it, lands in attempts/<n>/stop.json: never verified.
        self.recorder = StopRecorder(attempt_dir_from_env())

    # --- loading ---------------------------------------------------------------------------------
    def load(self, submission: str, sha256: str) -> Any:
        """The newest verified checkpoint's DelayedSubmission, else the original (its sha256 checked)."""
        found = self.run.resume_checkpoint()
        if found is not None:
            step, path = found
            manifest = protocol.read_json_bounded(path / protocol.MANIFEST)
            meta = manifest["files"].get(CHECKPOINT_FILE) if isinstance(manifest, dict) else None
            if not isinstance(meta, dict):
                raise _Unusable(f"{path.name} verifies but holds no {CHECKPOINT_FILE}: not a submitit checkpoint")
            delayed = _unpickle(path / CHECKPOINT_FILE, meta["sha256"])
            self.checkpoint, self.resumed_from = path, step
            log(f"resumed from {path.relative_to(self.run.run_dir)} (the DelayedSubmission checkpoint() returned)")
            return delayed
        try:
            path = protocol.resolve_inside(self.run.run_dir, submission)
        except protocol.UnsafePath as e:
            raise _Unusable(f"--submission {submission!r}: {e}") from None
        if not path.is_file():
            raise _Unusable(f"the submission {submission} is missing from {self.run.run_dir}")
        return _unpickle(path, sha256)

    # --- stops -----------------------------------------------------------------------------------
    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.recorder.notify(signum)
        if self.signum is None:
            self.signum = signum
        if self.phase != "calling" or self.safe_points or self.busy:
            return  # the flag is all: the next safe_point() (or the runner, around the call) acts on it
        # submitit's own semantics, for callables that never reach a safe point: checkpoint() right here,
        # wherever the main thread was (an optimizer step half applied, a file half written).
        log(f"{signal_name(signum)} before any safe_point() in this attempt: calling checkpoint() in the "
            "signal handler (submitit's semantics; the state may be torn)")
        self.stop("called in the signal handler (no safe_point() reached; submitit's semantics)")

    def safe_point(self, step: int | None, save: bool, progress: dict[str, Any]) -> None:
        self.safe_points += 1
        if step is not None:
            self.step = int(step)
        if self.heartbeat is not None:
            # resumed_from: where this attempt began (`orch metrics` measures the steps redone after a preemption)
            at = {"step": self.step, "resumed_from": self.resumed_from or 0} if self.step is not None else {}
            self.heartbeat.post(**at, **progress)
        if self.busy or self.phase != "calling":
            return
        if self.signum is not None:
            self.stop("called at safe_point()")
        if self._periodic_due():
            save = True
        if save:
            self.busy = True
            try:
                self.commit()
            finally:
                self.busy = False

    def _periodic_due(self) -> bool:
        """Without a periodic checkpoint a kill -9 (no signal, no handler) redid the whole run."""
        return bool(self.checkpoint_every_s) and time.monotonic() - self.last_commit >= self.checkpoint_every_s

    def stop(self, how: str) -> None:
        self.busy = True
        committed = self.commit()
        self.recorder.record_step(self.step)
        raise _StopAttempt(f"checkpoint() {how}; committed {committed.relative_to(self.run.run_dir)}"
                           if committed is not None else
                           f"{type(self.delayed.function).__name__} has no checkpoint(): nothing committed")

    def commit(self) -> Path | None:
        """checkpoint() and commit what it returns; None for a callable without checkpoint()."""
        import cloudpickle

        ckpt = self.delayed._checkpoint_function()  # function.checkpoint(*args, **kwargs), as submitit calls it
        if ckpt is None:
            self.last_commit = time.monotonic()
            return None
        ckpt.set_timeout(self.delayed._timeout_min, self.delayed._timeout_countdown)
        data = cloudpickle.dumps(ckpt, pickle.HIGHEST_PROTOCOL)  # before anything is written: may raise
        n = self.step if self.step is not None else self._next_number()

        def write(tmp: Path) -> None:
            (tmp / CHECKPOINT_FILE).write_bytes(data)

        self.checkpoint = commit_checkpoint(self.run.run_dir, n, write=write, keep_last_k=self.keep_last_k)
        self.last_commit = time.monotonic()
        return self.checkpoint

    def _next_number(self) -> int:
        """Without a step from safe_point(): one more than the newest committed checkpoint (a sequence)."""
        steps = [protocol.checkpoint_step(p) or 0 for p in protocol.iter_checkpoint_dirs(self.run.run_dir)]
        return max(steps, default=0) + 1


def _unpickle(path: Path, sha256: str) -> Any:
    """One read, hashed and unpickled: the bytes checked are the bytes loaded."""
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise _Unusable(f"{path.name} does not match its sha256 (changed or torn since it was written)")
    obj = pickle.loads(data)  # our own pickle, hash-checked; imports the callable's module
    # submitit's own check (DelayedSubmission.load): the class name, so copies of the class also load.
    if type(obj).__name__ != "DelayedSubmission":
        raise _Unusable(f"{path.name} holds a {type(obj).__name__}, not a DelayedSubmission")
    return obj


def _submitit_env(run: Run) -> None:
    """So that ``submitit.JobEnvironment()`` answers inside the callable, as under submitit."""
    os.environ["SUBMITIT_FOLDER"] = str(run.run_dir / SUBMISSION_DIR)
    if os.environ.get("SLURM_JOB_ID"):
        os.environ["SUBMITIT_EXECUTOR"] = "slurm"
        return
    os.environ.update(SUBMITIT_EXECUTOR="local", SUBMITIT_LOCAL_JOB_ID=f"{run.job}.{run.attempt}",
                      SUBMITIT_LOCAL_NTASKS="1", SUBMITIT_LOCAL_JOB_NUM_NODES="1", SUBMITIT_LOCAL_NODEID="0",
                      SUBMITIT_LOCAL_GLOBALID="0", SUBMITIT_LOCAL_LOCALID="0")


def _crash_detail(exc: BaseException) -> str:
    """The exception first (``orch show`` prints the start of a detail), then the traceback's tail from the
    callable's own frames on (the runner's and submitit's ``DelayedSubmission.result`` frames say nothing)."""
    head = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:400]
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and \
            tb.tb_frame.f_code.co_filename in (__file__, _SUBMITIT_UTILS):
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return f"{head}\n{text[-(1990 - len(head)):]}"


def run_job(submission: str, sha256: str, *, sys_path: Iterable[str] = (), keep_last_k: int = 2,
            run_dir: str | None = None, checkpoint_every_s: float = 0.0) -> int:
    """One attempt: load, call, then the marker, a preemption report or a crash report. Returns the exit code."""
    global _current
    try:
        run = Run.from_env(run_dir)
    except RunDirError as e:
        log(str(e))
        return protocol.EXIT_USAGE
    if run.already_complete():
        return protocol.EXIT_OK
    runner = _Runner(run, keep_last_k, checkpoint_every_s)
    runner.recorder.start()
    # First, before the (possibly long) unpickling: a stop from here on ends as a clean preemption.
    previous = {s: signal.signal(s, runner.on_signal) for s in STOP_SIGNALS}
    try:
        run.begin()
        if run.is_writer:
            clean_stale(run.run_dir)
        _submitit_env(run)
        for p in sys_path:  # the submitter's import paths, after this interpreter's own
            if p not in sys.path:
                sys.path.append(p)
        try:
            runner.delayed = runner.load(submission, sha256)
        except _Unusable as e:
            _report(run, "invalid", None, str(e))
            return protocol.EXIT_USAGE
        except Exception as e:  # e.g. the callable's module does not import on this node
            tb = traceback.format_exc()
            sys.stderr.write(tb)
            _report(run, "crash", None, "cannot load the submission: " + _crash_detail(e))
            return 1
        from orchestrator.kit.heartbeat import Heartbeat

        runner.heartbeat = Heartbeat(run.run_dir, run.attempt, run.heartbeat_s)
        if run.is_writer:
            runner.heartbeat.start()
        _current = runner
        try:
            if runner.signum is not None:
                raise _StopAttempt("the stop came while loading: the callable was not called")
            runner.phase = "calling"
            runner.last_commit = time.monotonic()
            result = runner.delayed.result()
            runner.phase = "finishing"
        except _StopAttempt as stop:
            runner.phase = "stopped"
            # The checkpoint the next attempt resumes from: committed now, or the one this attempt resumed from.
            rel = str(runner.checkpoint.relative_to(run.run_dir)) if runner.checkpoint else None
            what = f"{signal_name(runner.signum)}: {stop.how}; the next attempt resumes from " \
                   f"{rel or 'the original submission'}"
            _report(run, "preempted", runner.step, what, checkpoint=rel)
            at = f" at step {runner.step}" if runner.step is not None else ""
            log(f"preempted{at}: {what}; exit {protocol.EXIT_PREEMPTED}")
            return protocol.EXIT_PREEMPTED
        except Exception as e:  # the callable's own failure: reported, then exit 1
            runner.phase = "stopped"
            tb = traceback.format_exc()
            sys.stderr.write(tb)
            _report(run, "crash", runner.step, _crash_detail(e))
            return 1
        finally:
            _current = None
            runner.heartbeat.stop()
        if runner.signum is not None:
            # The callable returned, but a stop is never completion: its result is written and the
            # stop recorded; orch does not verify this attempt, and the next one reruns from the last checkpoint.
            log(f"{signal_name(runner.signum)} after the callable returned: result written, the stop is recorded")
        if run.is_writer:
            import cloudpickle

            run.result_dir.mkdir(parents=True, exist_ok=True)
            protocol.atomic_write(run.result_dir / RESULT_FILE, cloudpickle.dumps(result, pickle.HIGHEST_PROTOCOL))
            run.finish({"attempt": run.attempt, "resumed_from": runner.resumed_from, "step": runner.step,
                        "safe_points": runner.safe_points}, step=runner.step)
        return protocol.EXIT_OK
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        runner.recorder.close()


def _report(run: Run, cls: str, step: int | None, detail: str, **extra: Any) -> None:
    if run.is_writer:
        protocol.write_failure(run.run_dir, run.attempt, cls, step, detail, **extra)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.integrations.submitit_runner",
                                 description="Run a pickled submitit DelayedSubmission as one orch attempt.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="what OrchExecutor.submit submits")
    r.add_argument("--submission", required=True, help="the pickled DelayedSubmission, relative to the run dir")
    r.add_argument("--sha256", required=True, help="its sha256 (a changed or torn pickle is refused)")
    r.add_argument("--sys-path", action="append", default=[], help="an import path of the submitting process")
    r.add_argument("--keep-last-k", type=int, default=2, help="committed checkpoints kept (default 2)")
    r.add_argument("--run-dir", default=None, help="default $ORCH_RUN_DIR")
    r.add_argument("--checkpoint-every-s", type=float, default=DEFAULT_CHECKPOINT_EVERY_S,
                   help="commit the callable's checkpoint() at the first safe_point() this many seconds after the "
                        f"last commit (0: only on a stop signal; default {DEFAULT_CHECKPOINT_EVERY_S:g})")
    a = ap.parse_args(argv)
    if not _SHA256_RE.match(a.sha256):
        ap.error(f"--sha256 {a.sha256!r} is not 64 lowercase hex digits")
    if a.keep_last_k < 1:
        ap.error("--keep-last-k must be >= 1")
    if not 0 <= a.checkpoint_every_s <= 10**9:  # also refuses nan
        ap.error(f"--checkpoint-every-s {a.checkpoint_every_s} is not 0..1e9 seconds")
    return run_job(a.submission, a.sha256, sys_path=a.sys_path, keep_last_k=a.keep_last_k, run_dir=a.run_dir,
                   checkpoint_every_s=a.checkpoint_every_s)


if __name__ == "__main__":
    # Run as ``python -m``, this file is ``__main__``; the callable imports ``orchestrator.integrations.submitit``,
    # which imports a second copy of this module. The runner must live in that one, or safe_point() would never
    # see it.
    from orchestrator.integrations import submitit_runner as _module

    sys.exit(_module.main())
