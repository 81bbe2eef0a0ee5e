"""Commands that change things: reconcile, requeue, cancel, gc."""

from __future__ import annotations

import sys
import time

import click

from orchestrator.cli.app import _ctx, _emit, main


@main.command()
@click.option("--watch", type=click.FloatRange(0.5, None), metavar="SECONDS",
              help="Loop: one pass every SECONDS (backs off while the scheduler or the DB is unreachable).")
@click.option("--json", "as_json", is_flag=True, help="Print each pass's report as JSON.")
def reconcile(watch: float | None, as_json: bool) -> None:
    """One reconciler pass (run from cron every minute), or a loop with --watch.

    Polls every live attempt in one backend call, verifies markers, classifies failures, applies
    the policy and requeues what it requeues by itself. An overlapping pass exits quietly.
    """
    from orchestrator.errors import DatabaseInterrupted
    from orchestrator.ops.reconcile import reconcile_pass

    cfg, db = _ctx()
    delay = watch
    while True:
        try:
            rep = reconcile_pass(db, cfg)
        except DatabaseInterrupted as e:
            if watch is None:
                raise
            # A DB server restarted mid-pass ended the loop for good; the pass is crash-safe, so the
            # next one redoes what this one left (its lease is ours to take again).
            delay = min(delay * 2, watch * 10)
            click.echo(f"warning: pass interrupted: {e}; next pass in {delay:g}s", err=True)
            time.sleep(delay)
            continue
        if as_json:
            _emit(rep.as_dict())
        else:
            if not rep.ran:
                held = f" ({rep.lease_holder})" if rep.lease_holder else ""
                click.echo(f"another reconciler holds the lease{held}; nothing done", err=True)
            for w in rep.warnings:
                click.echo(f"warning: {w}", err=True)
            for c in (ch.as_dict() for ch in rep.changed):
                click.echo(f"{c['name']}: -> {c['to']}" + "".join(f" {k}={c[k]}" for k in ("class", "action", "why")
                                                                 if c.get(k)))
            for n in rep.requeued:
                click.echo(f"{n}: requeued")
            for u in rep.undecided[:20]:  # left as they were: the user sees why
                click.echo(f"{u.replace(': ', ': unknown (', 1)})")
            if len(rep.undecided) > 20:
                click.echo(f"... and {len(rep.undecided) - 20} more unknown (see --json)")
            for e in rep.errors:
                click.echo(f"warning: {e}", err=True)
        if watch is None:
            return
        # Scheduler unreachable: back off (up to 10x) instead of hammering it (SkyPilot #10155).
        delay = min(delay * 2, watch * 10) if rep.unknown and not rep.changed else watch
        time.sleep(delay)


@main.command()
@click.argument("names", nargs=-1)
@click.option("--failed", is_flag=True, help="Every retryable_failed job.")
@click.option("--dry-run", is_flag=True, help="Say what would be cleared and requeued; change nothing.")
@click.option("--nodes", type=click.IntRange(1, 100_000), default=None, metavar="N",
              help="Run the next attempt on N nodes (a multi-rank job; the checkpoint resumes on any world size).")
@click.option("--nproc-per-node", type=click.IntRange(1, 1024), default=None, metavar="K",
              help="Run the next attempt as K ranks per node (torchrun), from now on.")
@click.option("--json", "as_json", is_flag=True)
def requeue(names: tuple[str, ...], failed: bool, dry_run: bool, nodes: int | None, nproc_per_node: int | None,
            as_json: bool) -> None:
    """Clear what a failed job left that is not verified, and submit its next attempt.

    A job whose done marker verifies is never cleared or resubmitted (`orch requeue NAME` on it
    exits 3). Unverified leftovers go to $ORCH_HOME/trash/<job>/<time>/; verified checkpoints stay
    so the next attempt resumes. Exit 3 when any job was refused (the others are still requeued).

    --nodes/--nproc-per-node change the job's rank layout for this and later attempts (say 2 nodes -> 1
    after losing a node): orch's kit resumes a checkpoint on any world size; keeping the effective batch is
    the program's (a global batch split over the ranks it finds). Refused, with nothing written, where the
    job's backend cannot run it.
    """
    if bool(names) == failed:
        raise click.UsageError("give job NAMEs or --failed (not both)")
    if failed and (nodes is not None or nproc_per_node is not None):
        raise click.UsageError("--nodes/--nproc-per-node change the named jobs only (not --failed)")
    from orchestrator.errors import OrchError, Refused
    from orchestrator.ops.requeue import RequeueOutcome, RequeueTarget
    from orchestrator.ops.requeue import requeue as do_requeue

    cfg, db = _ctx()
    target = RequeueTarget.named(names, nodes, nproc_per_node) if names else RequeueTarget.failed()
    results = do_requeue(db, cfg, target, dry_run=dry_run)
    if as_json:
        _emit([r.as_dict() for r in results])
    else:
        if not results:
            click.echo("no retryable_failed jobs")
        for r in results:
            extra = f" as attempt {r.attempt}" if r.attempt else ""
            clears = f"; clears {', '.join(r.clears)}" if r.clears and r.outcome is not RequeueOutcome.REFUSED else ""
            if r.sets_aside and r.outcome is not RequeueOutcome.REFUSED:
                clears += f"; sets aside {', '.join(r.sets_aside)}"
            click.echo(f"{r.name}: {r.outcome.value.replace('_', ' ')}{extra} ({r.reason}){clears}")
    errors = [r for r in results if r.outcome is RequeueOutcome.ERROR]
    if errors:  # A launch error printed "error" and exited 0
        raise OrchError("; ".join(f"{r.name}: {r.reason}" for r in errors))
    refused = [r for r in results if r.outcome is RequeueOutcome.REFUSED]
    if not names:  # --failed: a job found verified is now done, which needs no one
        refused = [r for r in refused if not r.verified]
    if refused:  # --failed once printed a refusal that needs a person and exited 0
        raise Refused("refused: " + "; ".join(f"{r.name}: {r.reason}" for r in refused))


@main.command()
@click.argument("names", nargs=-1, required=True)
def cancel(names: tuple[str, ...]) -> None:
    """Cancel jobs: SIGTERM first (the job checkpoints), state cancelled."""
    from orchestrator.ops.cancel import cancel as do_cancel

    cfg, db = _ctx()
    results = do_cancel(db, cfg, list(names))
    for name, what in results:
        click.echo(f"{name}: {what}")
    if any(what.startswith("cancelled in orch, but") for _n, what in results):
        sys.exit(1)
    if any(what.startswith("not cancelled") for _n, what in results):
        sys.exit(3)  # refused: it had already ended (verified, failed or cancelled)


@main.command()
def gc() -> None:
    """Empty the trash (what requeue and policy moved aside). Verified runs are never touched."""
    from orchestrator.ops.trash import empty_trash

    cfg, _db = _ctx()
    click.echo(f"removed {empty_trash(cfg)} trashed entries")


