"""A preemption flag set by SIGTERM / SIGUSR2; the training loop acts on it at a safe point.

Why a flag and not work in the handler: Python runs signal handlers between bytecodes of the main
thread, i.e. possibly in the middle of an optimizer step, a ``torch.save`` or a checkpoint rename.
Saving from there (what Lightning's SIGUSR1 path does) can write a half-updated model. The handler
only records that a stop was asked for; the loop checks :attr:`PreemptionFlag.requested` at each
micro-batch boundary, where the state is consistent, and saves the last *completed* step.

Slurm sends SIGTERM on preemption and at the time limit (then SIGKILL after GraceTime / KillWait);
submitit and ``sbatch --signal=USR2@secs`` use SIGUSR2 as the early warning. Both mean the same here.

Usage from any training script (stdlib only, no torch)::

    from orchestrator.kit.preemption import PreemptionFlag
    flag = PreemptionFlag().install()
    for step in ...:
        if flag.requested:
            save_checkpoint(step); sys.exit(143)
        train_one_step()
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from orchestrator import protocol

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


def attempt_dir_from_env(environ: Mapping[str, str] | None = None) -> Path | None:
    """``attempts/<n>`` of the running attempt when orch started it (ORCH_RUN_DIR, ORCH_ATTEMPT), else None."""
    env = os.environ if environ is None else environ
    run_dir, attempt = env.get(protocol.ENV_RUN_DIR), env.get(protocol.ENV_ATTEMPT, "")
    if not run_dir or not attempt.isdigit() or int(attempt) < 1:
        return None
    return protocol.attempt_dir(run_dir, int(attempt))


class StopRecorder:
    """Writes ``attempts/<n>/stop.json`` when the program receives a stop signal, whoever sent it.

    A SIGTERM that reaches the program without passing through orch's wrapper (a user's kill,
    a container stop, a VM shutdown) left no trace, and a framework that then exits 0 (HF's
    enable_jit_checkpoint, Lightning) was verified half-trained. The signal handler only calls
    :meth:`notify` (one ``os.write`` to a pipe: safe wherever the main thread was interrupted); a small
    writer thread writes the record at once, and :meth:`record_step` adds the step at the boundary.
    """

    def __init__(self, adir: Path | None) -> None:
        self.adir = adir
        self.signum: int | None = None
        self.at: str = ""
        self._written = False
        self._lock = threading.Lock()
        self._r = self._w = -1
        self._thread: threading.Thread | None = None

    def start(self) -> StopRecorder:
        """Start the thread that writes ``stop.json`` for a signal (a handler may not write files); under orch only."""
        if self.adir is None or self._thread is not None:
            return self
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._thread = threading.Thread(target=self._run, name="orch-stop-record", daemon=True)
        self._thread.start()
        return self

    def notify(self, signum: int) -> None:
        """From a signal handler: note the first stop and wake the writer (never blocks, never locks)."""
        if self.signum is not None:
            return
        self.signum, self.at = signum, protocol.now_iso()
        if self._w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._w, b"s")

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self._r, 64)
            except OSError:
                return
            if not data or b"q" in data:
                return
            self.write()

    def write(self, step: int | None = None) -> None:
        """(Re)write the record; ``step`` once known. Errors are logged, never raised (a full disk must not
        turn a clean stop into a crash; the exit status and the wrapper still tell the stop)."""
        if self.adir is None or self.signum is None:
            return
        with self._lock:
            if step is None and self._written:
                return
            try:
                protocol.write_stop(self.adir, signal.Signals(self.signum).name.removeprefix("SIG"), self.at, step,
                                    os.environ.get(protocol.ENV_TOKEN))
                self._written = True
            except OSError as e:
                import sys

                print(f"orch: could not write {protocol.STOP_FILE}: {e}", file=sys.stderr, flush=True)

    def record_step(self, step: int | None) -> None:
        """At the step boundary where the stop is acted on: the record names the last completed step."""
        self.write(step)

    def close(self) -> None:
        """Flush a stop not yet written (the program may exit right after) and end the writer thread."""
        if self.signum is not None:
            self.write()
        if self._thread is not None:
            with contextlib.suppress(OSError):
                os.write(self._w, b"q")
            self._thread.join(timeout=5)
            for fd in (self._r, self._w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._thread, self._r, self._w = None, -1, -1

_Handler = Callable[[int, FrameType | None], Any] | int | None


class PreemptionFlag:
    """Records that a stop was requested. Install once, in the main thread, as early as possible.

    ``install`` returns ``self`` so that ``flag = PreemptionFlag().install()`` reads naturally;
    ``uninstall`` restores the previous handlers (tests run several trainers in one process).
    """

    def __init__(self, attempt_dir: Path | None = None) -> None:
        self.signum: int | None = None  # the signal that asked for the stop (None: set by code)
        self.requested_at: float | None = None
        self.reason: str = ""
        self._previous: dict[int, _Handler] = {}
        # Under orch (ORCH_RUN_DIR/ORCH_ATTEMPT set) every signal is also recorded in attempts/<n>/stop.json.
        self.recorder = StopRecorder(attempt_dir if attempt_dir is not None else attempt_dir_from_env())

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for (a signal, or ``set``) and not cleared."""
        return self.requested_at is not None

    def set(self, reason: str = "requested by code") -> None:
        """Ask for a stop without a signal (tests, or a script's own wall-clock budget)."""
        if self.requested_at is None:
            self.requested_at = time.time()
            self.reason = reason

    def clear(self) -> None:
        """Forget the stop asked for (a drill that goes on after it)."""
        self.signum, self.requested_at, self.reason = None, None, ""
        self.recorder.signum = None

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        # Attribute assignments and one pipe write: safe wherever the main thread happened to be.
        if self.requested_at is None:
            self.signum = signum
            self.requested_at = time.time()
            self.reason = signal.Signals(signum).name
        self.recorder.notify(signum)

    def record_step(self, step: int | None) -> None:
        """Call where the stop is acted on (a step boundary): stop.json then names the last completed step."""
        if self.signum is not None:
            self.recorder.record_step(step)

    def install(self, signals: tuple[int, ...] = DEFAULT_SIGNALS) -> PreemptionFlag:
        """Handle ``signals`` (SIGTERM and SIGUSR2): each sets the flag and is recorded in ``stop.json``."""
        self.recorder.start()
        for s in signals:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def uninstall(self) -> None:
        """Give each signal back the handler it had before ``install``, where ours is still the one."""
        for s, h in self._previous.items():
            # Only where ours is still the handler: a framework that restored its own meanwhile (HF's
            # enable_jit_checkpoint restores SIG_DFL at train end) must not get back a handler that
            # swallows the next SIGTERM (JIT's, whose checkpoint no longer happens after training).
            if signal.getsignal(s) == self._handle:
                signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._previous.clear()
        self.recorder.close()

    def __enter__(self) -> PreemptionFlag:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()
