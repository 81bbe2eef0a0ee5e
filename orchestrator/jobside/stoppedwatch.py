"""The job wrapper's eye on its program's process: stopped (SIGSTOP, Ctrl-Z) or not.

A hostile pass: a program stopped before its first heartbeat (the bundled trainer half a second in), or
torchrun stopped before any rank started, was never judged hung: nothing the program writes could say so, and no
rule may judge a job from its start alone (a long import or restore is no hang). The wrapper, its parent, sees the
state itself: ``attempts/<n>/program-stopped.json`` exists while the program is stopped, written when the wrapper
first saw it so; ``staleness.judge`` calls the attempt hung once its mtime is older than ``hang_timeout_s``. A
wrapper stopped with its program (the whole session) leaves the file as it was: the program is still stopped.
"""

from __future__ import annotations

import contextlib
import os
import threading

from orchestrator import protocol
from orchestrator.filelock import is_stopped
from orchestrator.kit.heartbeat import DEFAULT_HEARTBEAT_S, heartbeat_interval


class StoppedWatch:
    """A daemon thread: every ``interval`` s, whether process ``pid`` is stopped; recorded in ``attempt_dir``."""

    def __init__(self, pid: int, attempt_dir: os.PathLike[str] | str, interval: float | None = None) -> None:
        self.pid = pid
        self.path = os.path.join(attempt_dir, protocol.PROGRAM_STOPPED)
        self.interval = interval if interval is not None else interval_from_env()
        self._done = threading.Event()
        self._written = False
        self._thread = threading.Thread(target=self._run, name="orch-stopped-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop looking; the record goes with the program (an attempt that ended is judged by its end)."""
        self._done.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            self.look()

    def look(self) -> None:
        stopped = is_stopped(self.pid)
        if stopped and not self._written:
            with contextlib.suppress(OSError):  # best effort: unrecorded, the start stays unjudged as before
                protocol.atomic_write_json(self.path, {"pid": self.pid, "since": protocol.now_iso()})
                self._written = True
        elif not stopped and self._written:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
                self._written = False


def interval_from_env(env: dict[str, str] | None = None) -> float:
    """How often the wrapper looks: as often as the kit beats (``ORCH_HEARTBEAT_S``; garbage: the default)."""
    try:
        return heartbeat_interval(env if env is not None else os.environ)
    except ValueError:
        return DEFAULT_HEARTBEAT_S
