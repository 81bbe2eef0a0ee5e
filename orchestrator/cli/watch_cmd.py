"""``orch watch NAME``: follow a job (or every task of a sweep) to its end with a live bar (plain lines when not on
a terminal).

Also the follower behind ``orch submit --wait`` (``follow_job``): both run reconcile passes while they
wait, so a job moves on without cron, and both end with exit 0 (verified) or 4 (not verified).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import IO

import click

from orchestrator.cli.app import EXIT_NOT_VERIFIED, _ctx, _emit, _show, main

EXIT_INTERRUPTED = 130


@main.command()
@click.argument("name")
@click.option("--interval", type=click.FloatRange(0.1, 3600), default=1.0, show_default=True,
              help="Seconds between looks.")
@click.option("--plain", is_flag=True, help="Plain lines even on a terminal.")
@click.option("--no-reconcile", is_flag=True,
              help="Only read; another reconciler (cron, another host) moves the job.")
@click.option("--json", "as_json", is_flag=True, help="Print nothing while waiting, then the job as JSON.")
def watch(name: str, interval: float, plain: bool, no_reconcile: bool, as_json: bool) -> None:
    """Follow job NAME until it ends: step/max, loss, tokens/s, ETA, attempt and restarts. NAME may be a
    sweep: its tasks counted by state until every one has ended.

    Exit 0 when its done marker verifies (a sweep: every task's), 4 when it ends otherwise, 2 for an
    unknown name, 130 on Ctrl-C (the job goes on).
    """
    cfg, db = _ctx()
    from orchestrator.views.progressview import sweep_snapshot

    if sweep_snapshot(db, name) is not None:  # `orch watch SWEEP` was refused, though show, cancel and status took one
        verified = follow_sweep(cfg, db, name, sys.stdout, quiet=as_json, plain=plain, poll_s=interval,
                                reconcile=not no_reconcile)
        if verified is None:
            sys.exit(EXIT_INTERRUPTED)
        if as_json:
            from orchestrator.views.show import show_sweep

            _emit(show_sweep(db, name))
        sys.exit(0 if verified else EXIT_NOT_VERIFIED)
    state = follow_job(cfg, db, name, sys.stdout, quiet=as_json, plain=plain, poll_s=interval,
                       reconcile=not no_reconcile)
    if state is None:
        sys.exit(EXIT_INTERRUPTED)  # quietly: ^C is already on the terminal, and the job is unharmed
    if as_json:
        _emit(_show(db, name))
    sys.exit(0 if state == "done_marker_verified" else EXIT_NOT_VERIFIED)


def follow_job(cfg, db, name: str, stream: IO[str], *, quiet: bool = False, plain: bool = False,
               poll_s: float = 1.0, reconcile: bool = True) -> str | None:
    """Follow ``name`` until it settles; its final state, or None after Ctrl-C.

    Raises JobNotFound (exit 2) before drawing anything for an unknown name.
    """
    from orchestrator.cli.live import make_view
    from orchestrator.ops.reconcile import reconcile_pass
    from orchestrator.views.progressview import QuietView, follow, snapshot

    snapshot(db, name)  # an unknown job fails here, before a bar is drawn
    view = QuietView() if quiet else make_view(stream, plain)
    with _ctrl_c() as stop:
        last = follow(db, cfg, name, view, poll_s=poll_s, stop=stop, pass_fn=reconcile_pass if reconcile else None)
    return None if last is None else last.state


def follow_sweep(cfg, db, name: str, stream: IO[str], *, quiet: bool = False, plain: bool = False,
                 poll_s: float = 1.0, reconcile: bool = True) -> bool | None:
    """Follow sweep ``name`` until every task settles: whether all verified, or None after Ctrl-C."""
    from orchestrator.cli.live import make_sweep_view
    from orchestrator.ops.reconcile import reconcile_pass
    from orchestrator.views import progressview

    view = progressview.QuietView() if quiet else make_sweep_view(stream, plain)
    with _ctrl_c() as stop:
        last = progressview.follow_sweep(db, cfg, name, view, poll_s=poll_s, stop=stop,
                                         pass_fn=reconcile_pass if reconcile else None)
    return None if last is None else last.verified


@contextlib.contextmanager
def _ctrl_c() -> Iterator[threading.Event]:
    """The first Ctrl-C sets the event: the pass under way finishes (a launch is never cut in half)
    and the follower stops at its next look. A second one interrupts at once."""
    stop = threading.Event()

    def on_sigint(_signum: int, _frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    try:
        old = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread (an embedding caller): Ctrl-C keeps its usual meaning
        yield stop
        return
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, old)
