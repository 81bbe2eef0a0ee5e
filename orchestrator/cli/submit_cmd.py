"""``orch submit``: parse, call ``orchestrator.submit.submit``, render; ``--wait`` follows the job."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from orchestrator.cli.app import EXIT_NOT_VERIFIED, _ctx, _emit, _show, main
from orchestrator.cli.args import _absolute_program, _default_name, _name_cb, job_options, job_settings


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
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
    from orchestrator.submit import SubmitRequest
    from orchestrator.submit import submit as do_submit

    command = _absolute_program(command)
    req = SubmitRequest(name=name or _default_name(command), command=list(command), backend=backend,
                        resources=resources, max_attempts=max_attempts or 3, outputs=list(outputs))
    cfg, db = _ctx()
    if max_attempts is None:
        req.max_attempts = cfg.max_attempts
    job = do_submit(db, cfg, req)
    if not as_json:
        a = job.attempts[-1]
        if a.external_id:
            click.echo(f"submitted {job.name} ({job.backend} {a.external_id}); run dir {job.run_dir}")
        else:  # e.g. cancelled while it launched
            click.echo(f"{job.name}: {job.state.value}, not started ({a.detail or a.state.value}); "
                       f"run dir {job.run_dir}")
    if wait:
        state = _wait(cfg, db, job.name, quiet=as_json)
        if as_json:
            _emit(_show(db, job.name))
        sys.exit(0 if state == "done_marker_verified" else EXIT_NOT_VERIFIED)
    if as_json:
        _emit(_show(db, job.name))


def _wait(cfg, db, name: str, quiet: bool, poll_s: float = 1.0) -> str:  # noqa: ANN001
    """Run reconcile passes until the job settles (retryable_failed counts only without auto-requeue)."""
    from orchestrator import protocol
    from orchestrator.jobs import get_job
    from orchestrator.lifecycle import JOB_SETTLED, JobState
    from orchestrator.reconcile import reconcile_pass

    last = None
    t0 = time.time()
    while True:
        reconcile_pass(db, cfg)
        with db.read() as s:
            job = get_job(s, name)
            state, n, run_dir, auto = job.state, len(job.attempts), job.run_dir, job.auto_requeue
        prog = protocol.read_progress(run_dir, n) or {}
        line = f"{name}: {state.value} (attempt {n}" + (f", step {prog['step']}" if "step" in prog else "") + ")"
        if line != last and not quiet:
            click.echo(f"[{time.time() - t0:6.1f}s] {line}", err=True)
            last = line
        if state in JOB_SETTLED and not (state is JobState.RETRYABLE_FAILED and auto):
            return state.value
        time.sleep(poll_s)


