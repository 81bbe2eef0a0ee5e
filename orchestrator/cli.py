"""The ``orch`` command line. Each command parses, calls one service function, renders.

Exit codes: 0 success; 1 unexpected error; 2 usage error (bad arguments, unknown job, bad
orch.toml); 3 refused (it would overwrite or rerun a verified result, or the job is in a state
that forbids it); 4 not verified (``orch verify`` answered ABSENT/CORRUPT, or ``submit --wait``
ended without a verified marker). ``--json`` prints exactly one JSON document on stdout.

Login-node latency: this module imports only click and the stdlib at start; the DB layer is
imported by the commands, and read commands never import torch or submitit.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import click

STATES = ("pending", "submitted", "running", "done_marker_verified", "retryable_failed", "failed", "cancelled")
EXIT_NOT_VERIFIED = 4


class OrchGroup(click.Group):
    """Maps domain errors to exit codes with one line on stderr; no tracebacks for users."""

    def invoke(self, ctx: click.Context) -> Any:
        from orchestrator.errors import OrchError

        try:
            return super().invoke(ctx)
        except OrchError as e:
            click.echo(f"orch: {e}", err=True)
            ctx.exit(e.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            click.echo("orch: interrupted", err=True)
            ctx.exit(130)
        except Exception as e:  # noqa: BLE001 - the last line of defence
            if os.environ.get("ORCH_DEBUG"):
                raise
            click.echo(f"orch: unexpected error: {type(e).__name__}: {str(e)[:300]} "
                       "(set ORCH_DEBUG=1 for a traceback)", err=True)
            ctx.exit(1)


def _ctx():
    """Config + DB, created on first use (ORCH_HOME 0700, DB 0600, schema at head)."""
    from orchestrator.config import load_config
    from orchestrator.db import Database

    cfg = load_config()
    return cfg, Database(cfg)


def _emit(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=1, sort_keys=True, default=str))


# ------------------------------------------------------------------------------------------
# argument-only validation (before any row or directory exists)
# ------------------------------------------------------------------------------------------
# Bounded digit runs: int() of a 5000-digit string raises ValueError (exit 1 instead of 2).
_MEM_RE = re.compile(r"^(\d{1,20})([KMGT]?)B?$", re.I)
MAX_MEM_MB = 2**43  # its size in bytes still fits a signed 64-bit integer (Slurm, the DB)
MAX_TIME_S = (2**32 - 2) * 60  # Slurm keeps a time limit in minutes in a uint32 (all ones = INFINITE)
_TIME_RE = re.compile(r"^(?:(\d{1,12})-)?(\d{1,12})(?::(\d{1,12}))?(?::(\d{1,12}))?$")


def parse_mem_mb(value: str) -> int:
    """Slurm-style memory (``500M``, ``4G``, ``1T``; a bare number is MB) in MB."""
    m = _MEM_RE.match(value.strip())
    if not m or int(m.group(1)) == 0:
        raise click.BadParameter(f"{value!r} is not a memory size like 500M, 4G or 1T", param_hint="--mem")
    n, unit = int(m.group(1)), m.group(2).upper()
    mb = {"K": n // 1024, "": n, "M": n, "G": n * 1024, "T": n * 1024 * 1024}[unit]
    # Refused here rather than by sbatch after the job row exists (and the reconciler would retry
    # the launch every pass); "9"*400+"K" also overflowed the float division (exit 1, not 2).
    if mb > MAX_MEM_MB:
        raise click.BadParameter(f"{value!r} is more than {MAX_MEM_MB} MB", param_hint="--mem")
    return max(1, mb)


def parse_time_s(value: str) -> int:
    """Slurm time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS -> seconds."""
    m = _TIME_RE.match(value.strip())
    if not m:
        raise click.BadParameter(f"{value!r} is not a time like 30, 1:30:00 or 2-00:00:00", param_hint="--time")
    d, a, b, c = m.groups()
    if d is not None:  # D-HH[:MM[:SS]]
        secs = int(d) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
        parts = [int(b or 0), int(c or 0)]
    elif c is not None:  # HH:MM:SS
        secs, parts = int(a) * 3600 + int(b) * 60 + int(c), [int(b), int(c)]
    elif b is not None:  # MM:SS
        secs, parts = int(a) * 60 + int(b), [int(b)]
    else:  # MM
        secs, parts = int(a) * 60, []
    if any(p >= 60 for p in parts) or secs <= 0:
        raise click.BadParameter(f"{value!r} is not a valid positive time", param_hint="--time")
    if secs > MAX_TIME_S:
        raise click.BadParameter(f"{value!r} is longer than Slurm can express", param_hint="--time")
    return secs


def _name_cb(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from orchestrator.protocol import UnsafePath, validate_job_name

    try:
        return validate_job_name(value)
    except UnsafePath as e:
        raise click.BadParameter(str(e)) from None


def _outputs_cb(_ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    for g in value:
        parts = g.split("/")
        # An output glob that leaves the run dir would let the marker vouch for files orch doesn't own.
        if not g or g.startswith("/") or ".." in parts or "\x00" in g or "\n" in g:
            raise click.BadParameter(f"{g!r} must be a relative glob inside the run dir (no '/...' or '..')")
    return value


def _plain_cb(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # Values that end up in sbatch directives: a newline or '#' could smuggle an #SBATCH line.
    # fullmatch: with re.match, "$" also matches before a trailing newline ("gpu\n" passed).
    if value is not None and not re.fullmatch(r"[A-Za-z0-9._,:=@/+-]+", value):
        raise click.BadParameter(f"{value!r} contains characters not allowed in --{param.name}")
    return value


def _absolute_program(cmd: tuple[str, ...]) -> tuple[str, ...]:
    """A relative program path (``.venv/bin/python``) means the submitter's cwd, not the run dir the
    job runs in; bare names (``python``) are looked up on PATH by the job, as usual."""
    prog = cmd[0]
    if "/" in prog and not os.path.isabs(prog):
        prog = os.path.abspath(prog)
    return (prog, *cmd[1:])


def _default_name(cmd: tuple[str, ...]) -> str:
    import secrets

    base = re.sub(r"[^A-Za-z0-9._-]", "-", Path(cmd[0]).name)[:40].strip(".-") or "job"
    if base in ("python", "python3") and len(cmd) > 2 and cmd[1] == "-m":
        base = re.sub(r"[^A-Za-z0-9._-]", "-", cmd[2])[:40] or base
    return f"{base}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


# ------------------------------------------------------------------------------------------
@click.group(cls=OrchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option("0.1.0", prog_name="orch")
def main() -> None:
    """orch: run long training jobs on Slurm or this machine; never lose or rerun a finished one.

    A job is finished when, and only when, its run dir's done.json verifies (every listed file
    has its recorded size and sha256). State lives in $ORCH_HOME (default ~/.orch).

    Exit codes: 0 ok, 1 unexpected error, 2 usage, 3 refused, 4 not verified.
    """


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
@click.option("--wait", is_flag=True, help="Wait for the job to end (runs reconcile passes meanwhile).")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def submit(name: str | None, backend: str, partition: str | None, account: str | None, gpus: int | None,
           cpus_per_task: int | None, mem: str | None, time_: str | None, max_attempts: int | None,
           outputs: tuple[str, ...], sbatch_args: tuple[str, ...], wait: bool, as_json: bool,
           command: tuple[str, ...]) -> None:
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
    from orchestrator.service import SubmitRequest
    from orchestrator.service import submit as do_submit

    command = _absolute_program(command)
    req = SubmitRequest(name=name or _default_name(command), command=list(command), backend=backend,
                        resources=resources, max_attempts=max_attempts or 3, outputs=list(outputs))
    cfg, db = _ctx()
    if max_attempts is None:
        req.max_attempts = cfg.max_attempts
    job = do_submit(db, cfg, req)
    if not as_json:
        click.echo(f"submitted {job.name} ({job.backend} {job.attempts[-1].external_id}); run dir {job.run_dir}")
    if wait:
        state = _wait(cfg, db, job.name, quiet=as_json)
        if as_json:
            _emit(_show(db, job.name))
        sys.exit(0 if state == "done_marker_verified" else EXIT_NOT_VERIFIED)
    if as_json:
        _emit(_show(db, job.name))


def _wait(cfg, db, name: str, quiet: bool, poll_s: float = 1.0) -> str:  # noqa: ANN001
    from orchestrator import protocol
    from orchestrator.jobs import get_job
    from orchestrator.reconcile import reconcile_pass
    from orchestrator.states import SETTLED, JobState

    last = None
    t0 = time.time()
    while True:
        reconcile_pass(db, cfg)
        with db.read() as s:
            job = get_job(s, name)
            state, n, run_dir = job.state, len(job.attempts), job.run_dir
        prog = protocol.read_progress(run_dir, n) or {}
        line = f"{name}: {state} (attempt {n}" + (f", step {prog['step']}" if "step" in prog else "") + ")"
        if line != last and not quiet:
            click.echo(f"[{time.time() - t0:6.1f}s] {line}", err=True)
            last = line
        if JobState(state) in SETTLED and JobState(state) is not JobState.RETRYABLE_FAILED:
            return state
        if JobState(state) is JobState.RETRYABLE_FAILED:
            with db.read() as s:
                a = get_job(s, name).attempts[-1]
                auto = bool((a.action or {}).get("auto"))
            if not auto:
                return state
        time.sleep(poll_s)


@main.command()
@click.option("--state", type=click.Choice(STATES), help="Only jobs in this state.")
@click.option("--json", "as_json", is_flag=True)
def status(state: str | None, as_json: bool) -> None:
    """One row per job: state, attempts, backend id of the latest attempt, progress."""
    from orchestrator.views import status_rows

    cfg, db = _ctx()
    rows = status_rows(db, cfg, state)
    if as_json:
        _emit(rows)
        return
    if not rows:
        click.echo("no jobs" + (f" in state {state}" if state else ""))
        return
    cols = [("NAME", "name"), ("STATE", "state"), ("ATT", "attempts"), ("BACKEND", "backend"),
            ("JOB ID", "external_id"), ("STEP", "step"), ("CLASS", "failure_class"), ("FLAGS", "flags")]
    table = [[h for h, _ in cols]] + [[_cell(r.get(k)) for _, k in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _cell(v: Any) -> str:
    if v is None or v == []:
        return "-"
    if isinstance(v, list):
        return ",".join(map(str, v))
    return str(v)


def _show(db, name: str) -> dict[str, Any]:  # noqa: ANN001
    from orchestrator.views import show_job

    return show_job(db, name)


@main.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
def show(name: str, as_json: bool) -> None:
    """A job and every attempt: backend id, state, failure class, action taken, times."""
    _cfg, db = _ctx()
    d = _show(db, name)
    if as_json:
        _emit(d)
        return
    click.echo(f"{d['name']}: {d['state']}  backend={d['backend']}  run_dir={d['run_dir']}")
    click.echo(f"  command: {' '.join(d['command'])}")
    if d.get("overrides"):
        click.echo(f"  overrides for the next attempt: {json.dumps(d['overrides'], sort_keys=True)}")
    for a in d["attempts"]:
        fields = [f"id={_cell(a['external_id'])}", f"class={_cell(a['failure_class'])}",
                  f"step={_cell(a['failure_step'])}", f"exit={_cell(a['exit_code'])}", f"restarts={a['restarts']}"]
        click.echo(f"  attempt {a['n']}: {a['state']}  " + "  ".join(fields))
        if a.get("detail"):
            click.echo(f"    detail: {a['detail']}")
        if a.get("action"):
            act = {k: v for k, v in a["action"].items() if k != "plan"}
            click.echo(f"    action: {json.dumps(act, sort_keys=True)}")


@main.command()
@click.argument("target")
def verify(target: str) -> None:
    """Exit 0 iff TARGET's done marker verifies. TARGET is a job name or a run dir path.

    Prints VERIFIED, ABSENT: reason, or CORRUPT: reason (exit 4 for the last two).
    """
    from orchestrator.protocol import verify_done_marker

    if "/" in target or target in (".", ".."):
        run_dir = Path(target)
        try:
            is_dir = run_dir.is_dir()
        except OSError:  # ENAMETOOLONG and friends: still a bad argument (exit 2), not a crash (exit 1)
            is_dir = False
        if not is_dir:
            raise click.BadParameter(f"{target[:200]} is not a directory", param_hint="TARGET")
    else:
        run_dir = _run_dir_of(target)
    v = verify_done_marker(run_dir)
    click.echo(str(v))
    sys.exit(0 if v.verified else EXIT_NOT_VERIFIED)


def _run_dir_of(name: str) -> Path:
    from orchestrator.errors import JobNotFound
    from orchestrator.jobs import get_job

    cfg, db = _ctx()
    try:
        with db.read() as s:
            return Path(get_job(s, name).run_dir)
    except JobNotFound as e:
        from orchestrator.protocol import UnsafePath
        from orchestrator.rundir import run_dir_for

        try:
            p = run_dir_for(cfg, name)
        except UnsafePath:  # `orch verify -` was an "unexpected error" (exit 1); it is no job: exit 2
            raise e from None
        if not p.exists():
            raise
        return p


@main.command()
@click.option("--watch", type=click.FloatRange(0.5, None), metavar="SECONDS",
              help="Loop: one pass every SECONDS (backs off while the scheduler is unreachable).")
@click.option("--json", "as_json", is_flag=True, help="Print each pass's report as JSON.")
def reconcile(watch: float | None, as_json: bool) -> None:
    """One reconciler pass (run from cron every minute), or a loop with --watch.

    Polls every live attempt in one backend call, verifies markers, classifies failures, applies
    the policy and requeues what it requeues by itself. An overlapping pass exits quietly.
    """
    from orchestrator.reconcile import reconcile_pass

    cfg, db = _ctx()
    delay = watch
    while True:
        rep = reconcile_pass(db, cfg)
        if as_json:
            _emit(rep.as_dict())
        else:
            if not rep.ran:
                click.echo("another reconciler holds the lease; nothing done", err=True)
            for c in rep.changed:
                click.echo(f"{c['name']}: -> {c['to']}" + "".join(f" {k}={c[k]}" for k in ("class", "action", "why")
                                                                 if c.get(k)))
            for n in rep.requeued:
                click.echo(f"{n}: requeued")
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
@click.option("--json", "as_json", is_flag=True)
def requeue(names: tuple[str, ...], failed: bool, dry_run: bool, as_json: bool) -> None:
    """Clear what a failed job left that is not verified, and submit its next attempt.

    A job whose done marker verifies is never cleared or resubmitted (`orch requeue NAME` on it
    exits 3). Unverified leftovers go to $ORCH_HOME/trash/<job>/<time>/; verified checkpoints stay
    so the next attempt resumes.
    """
    if bool(names) == failed:
        raise click.UsageError("give job NAMEs or --failed (not both)")
    from orchestrator.errors import Refused
    from orchestrator.service import requeue as do_requeue

    cfg, db = _ctx()
    results = do_requeue(db, cfg, list(names) if names else None, dry_run=dry_run)
    if as_json:
        _emit([r.as_dict() for r in results])
    else:
        if not results:
            click.echo("no retryable_failed jobs")
        for r in results:
            extra = f" as attempt {r.attempt}" if r.attempt else ""
            clears = f"; clears {', '.join(r.clears)}" if r.clears and r.outcome != "refused" else ""
            click.echo(f"{r.name}: {r.outcome.replace('_', ' ')}{extra} ({r.reason}){clears}")
    refused = [r for r in results if r.outcome == "refused"]
    if names and refused:
        raise Refused("refused: " + "; ".join(f"{r.name}: {r.reason}" for r in refused))


@main.command()
@click.argument("names", nargs=-1, required=True)
def cancel(names: tuple[str, ...]) -> None:
    """Cancel jobs: SIGTERM first (the job checkpoints), state cancelled."""
    from orchestrator.service import cancel as do_cancel

    cfg, db = _ctx()
    results = do_cancel(db, cfg, list(names))
    for name, what in results:
        click.echo(f"{name}: {what}")
    if any(what.startswith("cancelled in orch, but") for _n, what in results):
        sys.exit(1)
    if any(what.startswith("not cancelled") for _n, what in results):
        sys.exit(3)  # refused: it had already ended (verified, failed or cancelled)


@main.command()
@click.argument("name")
@click.option("--attempt", type=click.IntRange(1, None), help="Attempt number (default: the latest).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the attempt ends.")
def logs(name: str, attempt: int | None, follow: bool) -> None:
    """The stdout and stderr of one attempt of NAME."""
    from orchestrator.views import log_paths

    cfg, db = _ctx()
    paths, live = log_paths(db, name, attempt)
    if not follow:
        for p in paths:
            if p.exists():
                click.echo(f"==> {p} <==")
                sys.stdout.write(p.read_text(errors="replace"))
        return
    out = paths[0]
    pos = 0
    while True:
        if out.exists():
            with open(out, errors="replace") as f:
                f.seek(pos)
                chunk = f.read()
                pos = f.tell()
            if chunk:
                sys.stdout.write(chunk)
                sys.stdout.flush()
        if not live():
            return
        time.sleep(1.0)


@main.command()
def gc() -> None:
    """Empty the trash (what requeue and policy moved aside). Verified runs are never touched."""
    from orchestrator.service import gc as do_gc

    cfg, _db = _ctx()
    click.echo(f"removed {do_gc(cfg)} trashed entries")


if __name__ == "__main__":
    main()
