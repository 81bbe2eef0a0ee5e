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

import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)

_Handler = Callable[[int, FrameType | None], Any] | int | None


class PreemptionFlag:
    """Records that a stop was requested. Install once, in the main thread, as early as possible.

    ``install`` returns ``self`` so that ``flag = PreemptionFlag().install()`` reads naturally;
    ``uninstall`` restores the previous handlers (tests run several trainers in one process).
    """

    def __init__(self) -> None:
        self.signum: int | None = None  # the signal that asked for the stop (None: set by code)
        self.requested_at: float | None = None
        self.reason: str = ""
        self._previous: dict[int, _Handler] = {}

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def set(self, reason: str = "requested by code") -> None:
        """Ask for a stop without a signal (tests, or a script's own wall-clock budget)."""
        if self.requested_at is None:
            self.requested_at = time.time()
            self.reason = reason

    def clear(self) -> None:
        self.signum, self.requested_at, self.reason = None, None, ""

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        # Only attribute assignments: safe wherever the main thread happened to be.
        if self.requested_at is None:
            self.signum = signum
            self.requested_at = time.time()
            self.reason = signal.Signals(signum).name

    def install(self, signals: tuple[int, ...] = DEFAULT_SIGNALS) -> PreemptionFlag:
        for s in signals:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def uninstall(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> PreemptionFlag:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()
