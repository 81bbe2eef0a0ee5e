"""``orch submit``: parse, call ``orchestrator.ops.submit.submit``, render; ``--wait`` follows the job."""

from __future__ import annotations

import sys
from typing import Any

import click

from orchestrator.cli.app import EXIT_NOT_VERIFIED, _cfg, _emit, _show, main
from orchestrator.cli.args import _absolute_program, _default_name, _name_cb, job_options, job_settings
from orchestrator.cli.watch_cmd import EXIT_INTERRUPTED, follow_job

LOST_BEFORE_SUBMIT = ("this launch lost its claim before its backend call (it was stopped or stalled past "
                      "the launch grace) and submitted nothing; the process that re-claimed it launches the job")


# No ignore_unknown_options: a misspelt orch option (--max-atempts) before the command used to become part
# of the command (exit 0); the first positional still ends orch's options, `--` or not.
@main.command(context_settings={"allow_interspersed_args": False})
@click.option("--name", callback=_name_cb, help="Job name (letters, digits, . _ -); default from the command.")
@job_options
@click.option("--wait", is_flag=True, help="Wait for the job to end (runs reconcile passes meanwhile).")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def submit(name: str | None, wait: bool, as_json: bool, command: tuple[str, ...], **opts: Any) -> None:
    """Submit COMMAND (after --) as a new job. The job gets ORCH_RUN_DIR, ORCH_JOB_NAME, ORCH_ATTEMPT.

    Refused (exit 3) if the job's run dir holds a verified done marker, or the name exists.
    A run dir that merely is non-empty (a failed earlier run) is not refused: what it holds that
    is unverified is moved to the trash and verified checkpoints are kept for resume.
    """
    backend, resources, max_attempts, outputs = job_settings(opts)
    command = _absolute_program(command)
    name = name or _default_name(command)
    cfg = _cfg()
    max_attempts = cfg.max_attempts if max_attempts is None else (max_attempts or 3)
    quick = None
    if not (wait or as_json):  # No SQLAlchemy import where the DB allows (orchestrator/ops/quicksubmit.py)
        from orchestrator.ops import quicksubmit

        quick = quicksubmit.submit(cfg, name, list(command), backend, resources, max_attempts, list(outputs))
        if quick is not None and quick.external_id is not None:
            click.echo(f"submitted {name} ({backend} {quick.external_id}); run dir {quick.run_dir}")
            return
    from orchestrator.core.db import Database
    from orchestrator.core.jobqueries import get_job
    from orchestrator.ops.submit import SubmitRequest
    from orchestrator.ops.submit import submit as do_submit

    db = Database(cfg)
    if quick is None:
        req = SubmitRequest(name=name, command=list(command), backend=backend, resources=resources,
                            max_attempts=max_attempts, outputs=list(outputs))
        job, launched = do_submit(db, cfg, req), req.launched
    else:  # the quick path met a deviation, handled by launch's own code: rendered from the DB as always
        with db.read() as s:
            job = get_job(s, name)
            job.attempts  # noqa: B018 - loaded while the session is open
        launched = quick.launched
    _said_submitted(job, launched, as_json)
    if wait:
        # Progress on stderr (stdout holds the "submitted" line or the JSON): a live bar on a
        # terminal, else the plain lines scripts have always parsed.
        state = follow_job(cfg, db, job.name, sys.stderr, quiet=as_json)
        if state is None:
            click.echo("orch: interrupted (the job goes on; `orch watch` follows it again)", err=True)
            sys.exit(EXIT_INTERRUPTED)
        if as_json:
            _emit(_show(db, job.name))
        sys.exit(0 if state == "done_marker_verified" else EXIT_NOT_VERIFIED)
    if as_json:
        _emit(_show(db, job.name))


def _said_submitted(job: Any, launched: Any, as_json: bool) -> None:
    from orchestrator.ops.launch import LaunchOutcome

    lost = launched is not None and launched.outcome is LaunchOutcome.LOST_CLAIM
    if lost:
        # Stopped (Ctrl-Z) or stalled past the launch grace: a reconciler re-claimed the launch (fencing).
        click.echo(f"orch: {job.name}: {launched.detail or LOST_BEFORE_SUBMIT}", err=True)
    if not as_json:
        a = job.attempts[-1]
        if a.external_id and lost:  # "submitted nothing" on stderr, "submitted" on stdout
            click.echo(f"{job.name}: launched by the process that re-claimed it ({job.backend} {a.external_id}); "
                       f"run dir {job.run_dir}")
        elif a.external_id:
            click.echo(f"submitted {job.name} ({job.backend} {a.external_id}); run dir {job.run_dir}")
        else:  # e.g. cancelled while it launched
            click.echo(f"{job.name}: {job.state.value}, not started ({a.detail or a.state.value}); "
                       f"run dir {job.run_dir}")
