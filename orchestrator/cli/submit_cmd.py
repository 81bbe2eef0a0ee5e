"""``orch submit``: parse, call ``orchestrator.submit.submit``, render; ``--wait`` follows the job."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from orchestrator.cli import EXIT_NOT_VERIFIED, _ctx, _emit, _show, main
from orchestrator.cli.args import (
    _absolute_program,
    _default_name,
    _name_cb,
    _outputs_cb,
    _plain_cb,
    parse_mem_mb,
    parse_time_s,
)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--name", callback=_name_cb, help="Job name (letters, digits, . _ -); default from the command.")
@click.option("--backend", type=click.Choice(["local", "slurm"]), default="local", show_default=True)
@click.option("--partition", callback=_plain_cb, help="Slurm partition.")
@click.option("--account", callback=_plain_cb, help="Slurm account.")
@click.option("--gpus", type=click.IntRange(0, 1024), help="GPUs per job.")
@click.option("--cpus-per-task", type=click.IntRange(1, 4096), help="CPUs per task.")
@click.option("--mem", help="Memory, Slurm style: 500M, 16G.")
@click.option("--time", "time_", help="Time limit, Slurm style: 30, 4:00:00, 2-00:00:00.")
@click.option("--max-attempts", type=click.IntRange(1, 1000), default=None,
              help="Attempts that count (preemptions, time limits and node failures do not); "
                   "default: policy.max_attempts in orch.toml, else 3.")
@click.option("--outputs", multiple=True, callback=_outputs_cb,
              help="Glob (relative to the run dir) of result files; orch writes done.json after exit 0. "
                   "For programs that do not write their own marker.")
@click.option("--sbatch-arg", "sbatch_args", multiple=True, help="Extra sbatch argument, e.g. --qos=high.")
@click.option("--warning-signal", type=click.Choice(["TERM", "USR2", "INT"]), default=None,
              help="Signal the program gets when the time limit nears (Slurm's early warning). "
                   "Default TERM; USR2 for the bundled trainer.")
@click.option("--wait", is_flag=True, help="Wait for the job to end (runs reconcile passes meanwhile).")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def submit(name: str | None, backend: str, partition: str | None, account: str | None, gpus: int | None,
           cpus_per_task: int | None, mem: str | None, time_: str | None, max_attempts: int | None,
           outputs: tuple[str, ...], sbatch_args: tuple[str, ...], warning_signal: str | None, wait: bool,
           as_json: bool, command: tuple[str, ...]) -> None:
    """Submit COMMAND (after --) as a new job. The job gets ORCH_RUN_DIR, ORCH_JOB_NAME, ORCH_ATTEMPT.

    Refused (exit 3) if the job's run dir holds a verified done marker, or the name exists.
    A run dir that merely is non-empty (a failed earlier run) is not refused: what it holds that
    is unverified is moved to the trash and verified checkpoints are kept for resume.
    """
    resources: dict[str, Any] = {}
    if mem is not None:
        resources["mem_mb"] = parse_mem_mb(mem)
    if time_ is not None:
        resources["time_s"] = parse_time_s(time_)
    for k, v in (("partition", partition), ("account", account), ("gpus", gpus), ("cpus_per_task", cpus_per_task)):
        if v is not None:
            resources[k] = v
    if sbatch_args:
        # The backend's own check, run at parse time: an option orch owns (--output=, even as a
        # getopt prefix) used to be refused only at sbatch time, after the job row existed.
        from orchestrator.backends.base import BackendError
        from orchestrator.backends.slurm import validate_extra_sbatch

        try:
            validate_extra_sbatch(sbatch_args)
        except BackendError as e:
            raise click.BadParameter(str(e), param_hint="--sbatch-arg") from None
        resources["extra_sbatch"] = list(sbatch_args)
    if backend == "local" and (partition or account or sbatch_args):
        raise click.BadParameter("--partition/--account/--sbatch-arg need --backend slurm")
    if warning_signal is not None:
        resources["warning_signal"] = warning_signal
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


