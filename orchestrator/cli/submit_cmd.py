"""``orch submit``: parse, call ``orchestrator.submit.submit``, render; ``--wait`` follows the job."""

from __future__ import annotations

import sys
from typing import Any

import click

from orchestrator.cli.app import EXIT_NOT_VERIFIED, _ctx, _emit, _show, main
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
    from orchestrator.launch import LaunchOutcome
    from orchestrator.submit import SubmitRequest
    from orchestrator.submit import submit as do_submit

    command = _absolute_program(command)
    req = SubmitRequest(name=name or _default_name(command), command=list(command), backend=backend,
                        resources=resources, max_attempts=max_attempts or 3, outputs=list(outputs))
    cfg, db = _ctx()
    if max_attempts is None:
        req.max_attempts = cfg.max_attempts
    job = do_submit(db, cfg, req)
    if req.launched is not None and req.launched.outcome is LaunchOutcome.LOST_CLAIM:
        # Stopped (Ctrl-Z) or stalled past the launch grace: a reconciler re-claimed the launch (fencing).
        click.echo(f"orch: {job.name}: {req.launched.detail or LOST_BEFORE_SUBMIT}", err=True)
    if not as_json:
        a = job.attempts[-1]
        if a.external_id:
            click.echo(f"submitted {job.name} ({job.backend} {a.external_id}); run dir {job.run_dir}")
        else:  # e.g. cancelled while it launched
            click.echo(f"{job.name}: {job.state.value}, not started ({a.detail or a.state.value}); "
                       f"run dir {job.run_dir}")
    if wait:
        # Progress on stderr (stdout holds the "submitted" line or the JSON): a live bar on a
        # terminal, else the plain lines scripts have parsed since issue 1.
        state = follow_job(cfg, db, job.name, sys.stderr, quiet=as_json)
        if state is None:
            click.echo("orch: interrupted (the job goes on; `orch watch` follows it again)", err=True)
            sys.exit(EXIT_INTERRUPTED)
        if as_json:
            _emit(_show(db, job.name))
        sys.exit(0 if state == "done_marker_verified" else EXIT_NOT_VERIFIED)
    if as_json:
        _emit(_show(db, job.name))
