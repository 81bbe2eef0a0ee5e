"""Heartbeat: attempts/<n>/progress.json, written by a helper thread so the training loop never waits.

An fsync per heartbeat costs milliseconds on a network filesystem; done in the loop it would be
step overhead (bench P5). The thread writes only what the loop *posted* since its last write, so
when the loop stops making progress (a hang) the file stops changing, which is what a hang
detector needs to see. ``beat_now`` asks for an immediate write (at each checkpoint save).
"""

from __future__ import annotations

import collections
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator import protocol
from orchestrator.kit import stall


class Heartbeat:
    def __init__(self, run_dir: Path, attempt: int, interval_s: float = 2.0) -> None:
        self.run_dir = run_dir
        self.attempt = attempt
        self.interval_s = interval_s
        self._fields: dict[str, Any] = {}
        self._posted = 0
        self._written = 0
        self._wake = threading.Event()
        self._lock = threading.Lock()  # one writer at a time: the thread, or write_now's caller
        self._stop = False
        self._warned = False
        # Recent rates (one per write) and the job's own median of them: `orch status` flags a job
        # whose recent tokens/s falls far below its own median (a slow node, a throttled disk).
        self._rates: collections.deque[float] = collections.deque(maxlen=200)
        self._last: tuple[int, float] | None = None
        self._stall_base = stall.total()  # save_stall_s: this attempt's blocked saving (goodput accounting)
        self._stall_written = 0.0
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def post(self, **fields: Any) -> None:
        """Record the latest progress (cheap: no I/O in the caller)."""
        self._fields = fields
        self._posted += 1

    def beat_now(self) -> None:
        self._wake.set()

    def write_now(self) -> None:
        """Write what was posted, in the caller's thread, before returning. Once per attempt, at the
        start: the history's first line is then the resume step whatever the thread's timing (a
        thread woken by ``beat_now`` could lose the race to the loop's next post on a busy node)."""
        with self._lock:
            self._write()

    def stop(self) -> None:
        """Stop the thread after one last write of anything posted and not yet written."""
        self._stop = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._write()

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            with self._lock:
                self._write()

    def _write(self) -> None:
        posted, fields = self._posted, dict(self._fields)
        stalled = round(stall.total() - self._stall_base, 6)
        if posted == self._written and stalled == self._stall_written:  # a save after the last post: one beat
            return
        fields.setdefault("save_stall_s", stalled)
        step, per_step, now = fields.get("step"), fields.get("tokens_per_step"), time.monotonic()
        if isinstance(step, int) and per_step and self._last is not None and step > self._last[0]:
            self._rates.append((step - self._last[0]) * per_step / (now - self._last[1]))
            fields.update(tokens_per_s_recent=self._rates[-1], tokens_per_s_median=statistics.median(self._rates),
                          samples=len(self._rates))
        if isinstance(step, int):
            self._last = (step, now)
        try:
            protocol.write_progress(self.run_dir, self.attempt, **fields)
            self._written, self._stall_written = posted, stalled
        except Exception as e:  # a full disk must not stop training; the checkpoint path reports it
            if not self._warned:
                self._warned = True
                print(f"[trainer] heartbeat write failed: {e!r}", file=sys.stderr, flush=True)
