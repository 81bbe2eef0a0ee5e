"""Which rank of a running attempt stopped making progress: the one rule the hang stop (``observe``) and
``orch status``'s hang flag share, and the typed record of it (``Stale``) that the attempt keeps.

The hang stop's stale rank once travelled as text: observe wrote "rank 1: ...; stopping it" into the attempt's
free-text detail and classify cut the suffix off to build the final record. It is now three columns of the
attempt (``stale_rank``, ``stale_step``, ``stale_age_s``, migration 0010) and this dataclass.

Stdlib and ``orchestrator.protocol`` only: ``orch status``'s quick path imports it without SQLAlchemy.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from orchestrator import protocol

FUTURE_SKEW_S = 60.0  # an mtime this far ahead of our clock is a clock error (or a forgery), not news


@dataclass(frozen=True)
class Stale:
    """The rank a hang stop blames: the one furthest behind (rank 1 hung while rank 0 beat)."""

    rank: int | None  # None: a one-process job (its heartbeat names no world size); it has no ranks to name
    age_s: float  # how long that rank had made no progress when it was judged
    step: int | None  # the step of its last heartbeat; None: it wrote none with a step

    def describe(self) -> str:
        """One line for the attempt's record, built from the typed fields (never parsed back)."""
        if self.rank is None:
            return f"no heartbeat for {self.age_s:.0f} s" + (f" at step {self.step}" if self.step is not None else "")
        at = f" at step {self.step}" if self.step is not None else ", before any step heartbeat"
        return f"rank {self.rank}: no progress for {self.age_s:.0f} s{at}"


def judge(run_dir: Path, attempt: int, timeout_s: float, now: float, *, redate: bool = True,
          progress: dict | None = None) -> Stale | None:
    """The stale rank when some rank of the attempt made no heartbeat progress for ``timeout_s``, else None.

    Jobs that never write a heartbeat (rank 0's progress.json) are not judged, unless a rank of a multi-rank job
    armed as its program started (the kit's ``armed.rank-<r>.json``): then its start is judged too
    (``_unbeaten_start``). ``progress``: rank 0's heartbeat if the caller already read
    it. ``redate``: re-date a heartbeat dated in the future to ``now`` (the reconciler does; a read command such as
    ``orch status`` writes nothing and counts it fresh).
    """
    stopped = _stopped_program(run_dir, attempt, timeout_s, now, redate)
    if stopped is not None:
        return stopped
    if progress is None:
        progress = protocol.read_progress(run_dir, attempt)
    if not progress:
        return _unbeaten_start(run_dir, attempt, timeout_s, now, redate)
    attempt_dir = protocol.attempt_dir(run_dir, attempt)
    world = progress.get("world_size", 1)
    beats: dict[int, tuple[float, Path]] = {}
    started: float | None = None
    for rank, path in protocol.progress_files(run_dir, attempt, world).items():
        # When each heartbeat was last written, by the file's mtime: the filesystem's clock, not the "time"
        # the job writes. A node whose clock ran 60 s behind had a healthy job stopped as hung on every
        # attempt until it failed for good, and a heartbeat without "time" was never judged (hostile test).
        beat = seen_at(path, now, redate)
        if beat is None:
            continue
        if now - beat > timeout_s and started is None:
            # A Slurm in-place requeue restarts the wrapper (rewriting wrapper.json) long after the last
            # heartbeat of the previous run: count from the later of the two (read only when a beat is old).
            started = seen_at(attempt_dir / protocol.WRAPPER_FILE, now, redate) or 0.0
        beats[rank] = (max(beat, started or 0.0), path)
    missing = _lowest_absent(set(beats) | {0}, world)  # rank 0's file is judged apart, below
    if missing is None or 0 not in beats:
        return stale_rank(beats, now, timeout_s, world)
    # Rank 1 hung before its first beat while rank 0 beat: only the files that existed were judged, so
    # the hang was missed (or rank 0, waiting for it, was blamed). A missing rank counts from the attempt's start:
    # the later of wrapper.json and rank 0's first heartbeat, since every rank starts its heartbeat at the same
    # point, after the restore (a restore longer than hang_timeout_s must not make rank 1 stale the moment rank 0
    # beat, a few ms before rank 1 would have).
    if started is None:
        started = seen_at(attempt_dir / protocol.WRAPPER_FILE, now, redate) or 0.0
    since = max(started, min(_first_beat(run_dir, attempt), beats[0][0]))
    return stale_rank(beats, now, timeout_s, world, missing=(missing, since))


def stale_rank(beats: dict[int, tuple[float, Path]], now: float, timeout_s: float, world: int,
               missing: tuple[int, float] | None = None) -> Stale | None:
    """Judge the attempt by its OLDEST rank's progress: hung when any rank's last beat is older than
    ``timeout_s`` (rank 0 still beating, busy in eval or a thread of its own, hides no hung rank 1). Of the
    stale ranks the one furthest behind is named (lowest step, then the oldest beat): a peer blocked in a
    collective with it stops too, a step later. ``missing``: (the lowest rank that never wrote a heartbeat,
    the time it counts from); stale, it is the one furthest behind of all."""
    if missing is not None and now - missing[1] > timeout_s:
        return Stale(missing[0], now - missing[1], None)
    stale = {r: t for r, (t, _p) in beats.items() if now - t > timeout_s}
    if not stale:
        return None
    steps = {r: protocol.read_step(beats[r][1]) for r in stale}
    rank = min(stale, key=lambda r: (steps[r] is None, steps[r] or 0, stale[r], r))
    return Stale(rank if world > 1 else None, now - stale[rank], steps[rank])


def _unbeaten_start(run_dir: Path, attempt: int, timeout_s: float, now: float, redate: bool) -> Stale | None:
    """Rank 0 never beat. Judged only where a rank armed (its program beats; a hostile pass: rank 1 stopped before the
    process group formed, rank 0 waited in init_process_group, and nothing was ever judged):

    * the lowest rank that never armed is hung once ``timeout_s`` passed since the first rank armed;
    * an armed rank is hung once its record went ``timeout_s`` without being refreshed (nor its own heartbeat
      written): its program is stopped or dead; the oldest is named.

    Never from the attempt's start alone: CI stopped a healthy resume as hung because two ranks' torch imports and
    the restore took longer than the timeout from wrapper.json. A rank alive in a restore of any length refreshes its
    record. Records older than the attempt's (re)start are a previous run's (a Slurm in-place requeue): ignored."""
    d = protocol.attempt_dir(run_dir, attempt)
    start = seen_at(d / protocol.WRAPPER_FILE, now, redate) or -math.inf
    alive: dict[int, float] = {}
    firsts: list[float] = []
    armed = protocol.read_armed(run_dir, attempt)
    for rank, a in armed.items():
        seen = seen_at(d / protocol.RANK_ARMED.format(rank), now, redate)
        if seen is None or seen < start:
            continue
        own = seen_at(d / protocol.RANK_PROGRESS.format(rank), now, redate) if rank else None
        alive[rank] = max(seen, own or seen)
        firsts.append(max(start, min(seen, a.since if a.since is not None else seen)))
    if not alive:
        return None
    missing = _lowest_absent(set(alive), max(armed[r].world for r in alive))
    if missing is not None and now - min(firsts) > timeout_s:
        return Stale(missing, now - min(firsts), None)
    stale = {r: t for r, t in alive.items() if now - t > timeout_s}
    if not stale:
        return None
    rank = min(stale, key=lambda r: (stale[r], r))
    return Stale(rank, now - stale[rank], None)


def _stopped_program(run_dir: Path, attempt: int, timeout_s: float, now: float, redate: bool) -> Stale | None:
    """Hung when the wrapper has seen its program stopped (SIGSTOP, Ctrl-Z) for ``timeout_s`` (``stoppedwatch``),
    whatever the program wrote or did not: a hostile pass stopped the trainer before its first heartbeat,
    and torchrun before any rank started, and neither was ever judged. A record older than the attempt's (re)start
    is a previous run's."""
    d = protocol.attempt_dir(run_dir, attempt)
    # Only the wrapper's own record, a regular file, says "stopped": a FIFO put there (hostile pass 3) got a job
    # that still beat stopped as hung on every attempt (the wrapper's atomic write never replaces it).
    if not _regular(d / protocol.PROGRAM_STOPPED):
        return None
    seen = seen_at(d / protocol.PROGRAM_STOPPED, now, redate)
    if seen is None or now - seen <= timeout_s:
        return None
    if seen < (seen_at(d / protocol.WRAPPER_FILE, now, redate) or -math.inf):
        return None
    return Stale(None, now - seen, None)


def _regular(path: Path) -> bool:
    """Whether ``path`` is a regular file (not followed: a symlink is not the wrapper's record)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _lowest_absent(present: set[int], world: int) -> int | None:
    """The lowest rank < ``world`` not in ``present``, or None (O(ranks present): a world_size of 10**7 in a hostile
    progress.json costs no 10**7 loop per pass)."""
    rank = 0
    while rank < world and rank in present:
        rank += 1
    return rank if rank < world else None


def _first_beat(run_dir: Path, attempt: int) -> float:
    """When rank 0 wrote its first heartbeat of the attempt: the "time" of the history's first line (the job's
    clock: the caller caps it by rank 0's file mtime, so a clock ahead delays nothing past that); -inf when
    unknown (the attempt's start then decides alone)."""
    t = (protocol.read_history_head(run_dir, attempt) or {}).get("time")
    return t if isinstance(t, float | int) else -math.inf


def seen_at(path: Path, now: float, redate: bool = True) -> float | None:
    """The time ``path`` was last written, for judging a hang; None when it cannot be read.

    A heartbeat dated in the future (a node clock ahead, `touch -d`) counted as fresh for ever, so a hung
    job was never stopped. Such an mtime is re-dated to ``now``, the first pass that saw it: the file
    itself keeps when orch first saw that heartbeat, with no DB column and nothing beside it. A job that
    still writes puts a new (future) mtime there, which the next pass re-dates again: it stays fresh, as it
    should; a job that stopped writing keeps the re-dated time and is judged hung hang_timeout_s later. A
    rename racing the re-dating only dates a just-written heartbeat to now: still fresh. If the time cannot
    be set (or ``redate`` is off), ``now`` is used for this pass (fresh), as before the re-dating existed.
    """
    try:
        mtime = os.lstat(path).st_mtime
    except OSError:
        return None
    if mtime <= now + FUTURE_SKEW_S:
        return mtime
    if redate:
        with contextlib.suppress(OSError):
            os.utime(path, (now, now), follow_symlinks=False)
    return now
