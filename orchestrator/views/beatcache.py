"""A running attempt's heartbeats, read from where the last read stopped: for a view that stays open.

The dashboard refreshes every 15 s and splits each shown live job's held time from its whole heartbeat history (up
to 8 MiB an attempt): 50 live rows re-parsed up to 400 MiB of JSON a refresh. Here each history keeps a cursor
(its file's identity, the bytes already parsed, the beats they held), and a refresh parses only the lines appended
since. What it returns is what ``goodputview.beats_of`` returns for the file as it is now (the newest
HISTORY_TAIL_BYTES, the first line of a cut tail dropped, torn lines skipped): a file replaced, truncated, or grown
by more than that tail is read again from its tail.
"""

from __future__ import annotations

import os
import threading
import time
from array import array
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass, field

from orchestrator import protocol
from orchestrator.core.goodput import Beat
from orchestrator.protocol import progress
from orchestrator.views.goodputview import beat_of

MAX_BEATS_KEPT = 750_000  # all cursors together, ~190 B a beat: ~140 MB (50 rows of 1 MiB histories: ~265,000)
STALE_S = 120.0  # a cursor not read for this long (its row no longer shown: pages refresh every 15 s) goes first


@dataclass
class _Cursor:
    identity: tuple[int, int]  # st_dev, st_ino: a history replaced under the same name is read again
    parsed_to: int  # the offset after the last newline parsed
    starts: array = field(default_factory=lambda: array("q"))  # each kept beat's line start offset
    beats: list[Beat] = field(default_factory=list)  # in order
    read_at: float = 0.0  # time.monotonic() of its last read


class BeatCache:
    """Cursors by history path, bounded by MAX_BEATS_KEPT beats; safe to share between a server's threads.

    Full, it evicts the cursors not read for STALE_S, then admits no new one: a page whose live rows hold more beats
    than the bound keeps a fixed part of them and reads the rest whole (evicting the least recent instead, a page
    read in the same order every refresh would evict each cursor just before its next read, and read every history
    whole)."""

    def __init__(self, max_beats: int = MAX_BEATS_KEPT) -> None:
        self.max_beats = max_beats
        self._cursors: OrderedDict[str, _Cursor] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def beats(self, run_dir: str, n: int) -> tuple[Beat, ...]:
        """The attempt's beats as ``beats_of(run_dir, n)`` gives them now."""
        path = str(protocol.attempt_dir(run_dir, n) / protocol.PROGRESS_HISTORY)
        try:
            f = protocol.open_regular(path)  # a FIFO, symlink or directory in its place: no history, never read
        except OSError:
            f = None
        if f is None:
            self._drop(path)
            return ()
        with f:
            st = os.fstat(f.fileno())
            limit = progress.HISTORY_TAIL_BYTES
            window = max(0, st.st_size - limit)  # the tail beats_of reads: lines that start after it
            with self._lock:
                c = self._cursors.pop(path, None)
                if c is not None:
                    self._held -= len(c.beats)
            if c is None or c.identity != (st.st_dev, st.st_ino) or c.parsed_to > st.st_size or c.parsed_to < window:
                c = _Cursor((st.st_dev, st.st_ino), window)
                f.seek(window)
                data = f.read(st.st_size - window)  # the file as fstat saw it: what is appended later, next time
                if window:  # a cut tail: its first line is probably cut, and dropped
                    nl = data.find(b"\n")
                    if nl < 0:  # one line longer than the tail: nothing to keep, and no line start to keep
                        return ()
                    c.parsed_to, data = window + nl + 1, data[nl + 1:]
            else:
                f.seek(c.parsed_to)
                data = f.read(st.st_size - c.parsed_to)
        end = data.rfind(b"\n") + 1  # complete lines are kept; a last line without its newline is read each time
        offset = c.parsed_to
        for line in data[:end].split(b"\n")[:-1]:
            if (rec := progress.history_record(line)) and (b := beat_of(rec)) is not None:
                c.starts.append(offset)
                c.beats.append(b)
            offset += len(line) + 1
        c.parsed_to += end
        if window:
            drop = bisect_right(c.starts, window)  # the lines that start after the tail's first byte are kept
            del c.starts[:drop]
            del c.beats[:drop]
        tail = progress.history_record(data[end:]) if end < len(data) else None
        last = beat_of(tail) if tail else None
        out = tuple(c.beats) + ((last,) if last is not None else ())
        self._keep(path, c)
        return out

    def _keep(self, path: str, c: _Cursor) -> None:
        now = time.monotonic()
        c.read_at = now
        with self._lock:
            while self._cursors and self._held + len(c.beats) > self.max_beats:
                _p, oldest = next(iter(self._cursors.items()))  # read least recently
                if oldest.read_at > now - STALE_S:
                    return  # full of cursors still read: this one is not kept
                self._cursors.popitem(last=False)
                self._held -= len(oldest.beats)
            if self._held + len(c.beats) <= self.max_beats:
                self._cursors[path] = c
                self._held += len(c.beats)

    def _drop(self, path: str) -> None:
        with self._lock:
            c = self._cursors.pop(path, None)
            if c is not None:
                self._held -= len(c.beats)
