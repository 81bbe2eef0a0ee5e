"""Heartbeat: attempts/<n>/progress.json, written by a helper thread so the training loop never waits.

An fsync per heartbeat costs milliseconds on a network filesystem; done in the loop it would be
step overhead (bench P5). The thread writes only what the loop *posted* since its last write, so
when the loop stops making progress (a hang) the file stops changing, which is what a hang
detector needs to see. ``beat_now`` asks for an immediate write (at each checkpoint save).

Several ranks: rank 0 writes ``progress.json`` (what ``orch status``, goodput and the plots read); every other
rank writes only its step to ``attempts/<n>/progress.rank-<r>.json`` (``protocol.write_rank_progress``), from
the same kind of thread, so the hang detector sees each rank's progress and names the one that stopped.
"""

from __future__ import annotations

import collections
import contextlib
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestrator import protocol
from orchestrator.kit import stall, wandbrecord

# Set by this process's first heartbeat write: its rank's start is over, and the armed record stops being refreshed.
_beat = threading.Event()
_armed: dict[tuple[str, int, int], Armed] = {}  # one refresher per (run dir, attempt, rank)
ENV_HEARTBEAT_S = "ORCH_HEARTBEAT_S"  # how often progress.json is rewritten (seconds, default 2)
DEFAULT_HEARTBEAT_S = 2.0


def heartbeat_interval(env: Mapping[str, str]) -> float:
    """``ORCH_HEARTBEAT_S`` from ``env``, held within 0.05..60 s (inf: a thread's wait() raises); ValueError when
    it is not a number. The kit's armed refresher and the wrapper's stopped-program watch look this often."""
    return min(60.0, max(0.05, float(env.get(ENV_HEARTBEAT_S, DEFAULT_HEARTBEAT_S))))


class Armed:
    """A rank's armed record and the thread that refreshes it until this process first beats (or ``stop``)."""

    def __init__(self, write: Callable[[], None], interval_s: float) -> None:
        self._write, self._interval_s, self._stop = write, interval_s, threading.Event()
        self._thread = threading.Thread(target=self._run, name="orch-armed", daemon=True)

    def start(self) -> Armed:
        self._write()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s) and not _beat.is_set():
            self._write()


def arm_from_env(environ: Mapping[str, str] | None = None) -> Armed | None:
    """Say, as a rank's program starts (before its process group forms), that this program beats: under orch
    (ORCH_RUN_DIR, ORCH_ATTEMPT) and torchrun's WORLD_SIZE > 1 only. The hang detector then judges the attempt's
    start too: a rank that never arms, hang_timeout_s after another did, is hung, and so is an armed
    rank whose record stops being refreshed before it beats (a thread rewrites it every ORCH_HEARTBEAT_S until this
    process's first heartbeat: a rank stopped or dead in its start stops it, a slow restore does not). Best effort:
    a failed write only leaves the start unjudged, as before. The record's refresher, or None."""
    env = os.environ if environ is None else environ
    try:
        world, rank = int(env.get("WORLD_SIZE", "1")), int(env.get("RANK", "0"))
        run_dir, attempt = env[protocol.ENV_RUN_DIR], int(env[protocol.ENV_ATTEMPT])
        interval = heartbeat_interval(env)
    except (KeyError, ValueError):
        return None
    if world < 2 or not 0 <= rank < world or not run_dir or attempt < 1:
        return None
    key = (run_dir, attempt, rank)
    if key in _armed:  # the integrations' import and the trainer's init_group both arm
        return _armed[key]
    since = time.time()

    def write() -> None:
        with contextlib.suppress(OSError):
            protocol.write_rank_armed(run_dir, attempt, rank, world, since)

    _armed[key] = armed = Armed(write, interval).start()
    return armed


def for_rank(run_dir: Path, attempt: int, interval_s: float, *, writer: bool, rank: int,
             world: int) -> Heartbeat | None:
    """This process's started heartbeat: the writer's (global rank 0, or a one-process job) ``progress.json``
    as ever; another rank's own small file when the job has several ranks; None otherwise (a job that is not
    multi-rank gets no per-rank file)."""
    if writer:
        return Heartbeat(run_dir, attempt, interval_s, world=world).start()
    if world > 1 and rank > 0:
        return Heartbeat(run_dir, attempt, interval_s, rank=rank).start()
    return None


class Heartbeat:
    """``attempts/<n>/progress.json`` (rank 0) or ``progress.rank-<r>.json``, rewritten every ``interval_s`` from a
    helper thread with what the loop last posted: orch's hang detector, ``orch status`` and ``orch watch`` read it."""
    def __init__(self, run_dir: Path, attempt: int, interval_s: float = 2.0, *, rank: int = 0,
                 world: int = 1) -> None:
        self.run_dir = run_dir
        self.attempt = attempt
        self.interval_s = interval_s
        self.rank = rank
        self.world = world  # rank 0 of several says so in progress.json: the detector then reads the rank files
        self._fields: dict[str, Any] = {}
        self._posted = 0
        self._written = 0
        self._wake = threading.Event()
        self._lock = threading.Lock()  # one writer at a time: the thread, or write_now's caller
        self._stop = False
        self._warned = False
        self._wandb_run: str | None = None  # the W&B run recorded in trackers.json (kit/wandbrecord.py)
        # Recent rates (one per write) and the job's own median of them: `orch status` flags a job
        # whose recent tokens/s falls far below its own median (a slow node, a throttled disk).
        self._rates: collections.deque[float] = collections.deque(maxlen=200)
        self._last: tuple[int, float] | None = None
        self._stall_base = stall.total()  # save_stall_s: this attempt's blocked saving (goodput accounting)
        self._stall_written = 0.0
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        """Start the writer thread; the heartbeat itself, for chaining."""
        self._thread.start()
        return self

    def post(self, **fields: Any) -> None:
        """Record the latest progress (cheap: no I/O in the caller)."""
        self._fields = fields
        self._posted += 1

    def beat_now(self) -> None:
        """Ask the writer thread to write at once, not at its next interval."""
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
        if self.rank:
            self._write_rank()
            return
        self._wandb_run = wandbrecord.note(self.run_dir, self._wandb_run)
        posted, fields = self._posted, dict(self._fields)
        stalled = round(stall.total() - self._stall_base, 6)
        if posted == self._written and stalled == self._stall_written:  # a save after the last post: one beat
            return
        fields.setdefault("save_stall_s", stalled)
        if self.world > 1:
            fields["world_size"] = self.world
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
            _beat.set()
        except Exception as e:  # a full disk must not stop training; the checkpoint path reports it
            self._warn(e)

    def _write_rank(self) -> None:
        """A rank > 0: only its step, and only when the loop posted since the last write (a hung rank's file
        then stops changing, as rank 0's does)."""
        posted, step = self._posted, self._fields.get("step")
        if posted == self._written:
            return
        try:
            protocol.write_rank_progress(self.run_dir, self.attempt, self.rank, step if isinstance(step, int) else None)
            self._written = posted
            _beat.set()
        except Exception as e:  # a full disk must not stop training
            self._warn(e)

    def _warn(self, e: Exception) -> None:
        if not self._warned:
            self._warned = True
            print(f"[trainer] heartbeat write failed: {e!r}", file=sys.stderr, flush=True)
