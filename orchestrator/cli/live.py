"""The two ways a followed job (or sweep) is drawn: a live bar on a terminal, plain lines everywhere else.

``make_view`` picks: a bar (rich, imported here and only here, when one is drawn) when the stream is
a terminal that can redraw, plain lines when it is a pipe, a file or ``TERM=dumb`` (cron mail, CI logs
and scripts parse those; see ``progressview.state_line``).
"""

from __future__ import annotations

import os
import time
from typing import IO, Any

from orchestrator.views.progressview import (
    VERIFIED,
    JobProgress,
    SweepProgress,
    View,
    measures,
    state_line,
    stats_text,
    sweep_line,
)

PLAIN_EVERY_S = 5.0  # plain mode: a progress-only line at most this often (state changes at once)


def can_redraw(stream: IO[str]) -> bool:
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "") not in ("", "dumb")


def make_view(stream: IO[str], plain: bool = False) -> View:
    if not plain and can_redraw(stream):
        return BarView(stream)
    return PlainView(stream)


class PlainView(View):
    """``[  12.3s] NAME: STATE (attempt N, step S)  max ..  loss ..``: one line per state change, and
    at most one per ``every_s`` while only the progress moves."""

    def __init__(self, stream: IO[str], every_s: float = PLAIN_EVERY_S) -> None:
        self.stream = stream
        self.every_s = every_s
        self.t0 = time.monotonic()
        self._key: tuple[Any, ...] | None = None
        self._line: str | None = None
        self._at = 0.0

    def update(self, snap: JobProgress) -> None:
        key = (snap.state, snap.attempt, snap.restarts)
        line = state_line(snap)
        now = time.monotonic()
        if key != self._key or (line != self._line and now - self._at >= self.every_s):
            stats = stats_text(snap)
            self.stream.write(f"[{now - self.t0:6.1f}s] {line}" + (f"  {stats}" if stats else "") + "\n")
            self.stream.flush()
            self._key, self._line, self._at = key, line, now

    def close(self, snap: JobProgress | None) -> None:
        pass


class _RichBar(View):
    """A rich progress bar redrawn in place (rich imported here, when one is drawn), lines printed above it."""

    def __init__(self, stream: IO[str]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self.console = Console(file=stream, force_terminal=True, highlight=False)
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=None),
                                 TextColumn("{task.fields[stats]}"), console=self.console,
                                 refresh_per_second=4, expand=True)
        self.task = self.progress.add_task("", total=None, stats="")
        self.t0 = time.monotonic()
        self.progress.start()

    def above(self, line: str) -> None:
        self.progress.console.print(f"[{time.monotonic() - self.t0:6.1f}s] {line}", markup=False, highlight=False)

    def close(self, snap: Any) -> None:
        self.progress.refresh()
        self.progress.stop()


class BarView(_RichBar):
    """A job's bar, with each state change printed above it."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__(stream)
        self._key: tuple[Any, ...] | None = None

    def update(self, snap: JobProgress) -> None:
        key = (snap.state, snap.attempt, snap.restarts)
        if key != self._key:
            self.above(state_line(snap))
            self._key = key
        total = snap.max_steps if snap.max_steps else None
        done = min(snap.step, total) if snap.step is not None and total else (snap.step or 0)
        self.progress.update(self.task, description=f"{snap.name} {snap.state}", total=total, completed=done,
                             stats=bar_stats(snap))


def bar_stats(snap: JobProgress) -> str:
    """What follows the bar: ``7/20 · loss 0.5714 · 1.0k tok/s · ETA 0:00:13 · attempt 1 · restarts 0``."""
    parts = []
    if snap.step is not None:
        parts.append(f"{snap.step}/{snap.max_steps}" if snap.max_steps else f"step {snap.step}")
    return " · ".join([*parts, *measures(snap), f"attempt {snap.attempt}", f"restarts {snap.restarts}"])


def make_sweep_view(stream: IO[str], plain: bool = False) -> View:
    if not plain and can_redraw(stream):
        return SweepBarView(stream)
    return SweepPlainView(stream)


class SweepPlainView(View):
    """``[  12.3s] lr: sweep of 4: 2 done_marker_verified, 2 running``: a line whenever the counts change."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.t0 = time.monotonic()
        self._line: str | None = None

    def update(self, snap: SweepProgress) -> None:  # type: ignore[override]
        line = sweep_line(snap)
        if line != self._line:
            self.stream.write(f"[{time.monotonic() - self.t0:6.1f}s] {line}\n")
            self.stream.flush()
            self._line = line

    def close(self, snap: SweepProgress | None) -> None:  # type: ignore[override]
        pass


class SweepBarView(_RichBar):
    """A bar of the tasks verified out of all, each change of the counts printed above it."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__(stream)
        self._line: str | None = None

    def update(self, snap: SweepProgress) -> None:  # type: ignore[override]
        line = sweep_line(snap)
        if line != self._line:
            self.above(line)
            self._line = line
        done = snap.states.get(VERIFIED, 0)
        self.progress.update(self.task, description=f"{snap.name} sweep", total=snap.tasks or None, completed=done,
                             stats=f"{done}/{snap.tasks} verified")
