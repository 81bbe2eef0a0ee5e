"""``orch sweep``: one command over a grid or a JSON-lines file of argument sets, one job per set."""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli.app import _cfg, _emit, main
from orchestrator.cli.args import _absolute_program, _name_cb, job_options, job_settings


# No ignore_unknown_options: a misspelt orch option (--max-atempts) before the command used to become part
# of the command (exit 0); the first positional still ends orch's options, `--` or not.
@main.command(context_settings={"allow_interspersed_args": False})
@click.option("--name", required=True, callback=_name_cb, help="Sweep name; task I is the job <name>.<I>.")
@click.option("--grid", "grid", multiple=True, metavar="KEY=V1,V2,...",
              help="An axis of the grid (repeatable): every combination is one task.")
@click.option("--from", "from_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="A JSON-lines file: one JSON object (an argument set) per line.")
@click.option("--throttle", type=click.IntRange(1, 100_000), default=None,
              help="At most this many tasks run at once (Slurm: --array=...%N; local: orch keeps to it).")
@job_options
@click.option("--json", "as_json", is_flag=True, help="Print the sweep as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def sweep(name: str, grid: tuple[str, ...], from_file: str | None, throttle: int | None, as_json: bool,
          command: tuple[str, ...], **opts: Any) -> None:
    """Run COMMAND (after --) once per argument set: a sweep of ordinary jobs.

    {KEY} in COMMAND becomes the task's value ({{ and }} are literal braces); each task also gets
    ORCH_SWEEP, ORCH_TASK_INDEX and ORCH_SWEEP_PARAMS (JSON). On Slurm the tasks go out as ONE job
    array, and a failed task's retry goes out with the others that need one as one small array;
    each task is classified, retried and verified on its own. `orch status` shows one line per
    sweep (--tasks for every task); `orch cancel NAME` and `orch requeue NAME` act on its tasks.
    """
    from orchestrator.errors import UsageError
    from orchestrator.ops.sweepspec import SweepRequest, check_argv_size, parse_grid, parse_params_file, render

    if bool(grid) == bool(from_file):
        raise click.UsageError("give --grid KEY=V1,V2 (repeatable) or --from FILE (not both)")
    backend, resources, max_attempts, outputs = job_settings(opts)
    params = parse_grid(list(grid)) if grid else parse_params_file(from_file)
    command = _absolute_program(command)
    try:
        # Every {KEY} must name a key, and every filled-in command must fit one exec: before anything is written.
        check_argv_size([render(list(command), p) for p in params])
    except UsageError as e:
        raise click.BadParameter(str(e), param_hint="COMMAND") from None
    cfg = _cfg()
    req = SweepRequest(name=name, command=list(command), params=params, backend=backend, resources=resources,
                       max_attempts=max_attempts or cfg.max_attempts, outputs=list(outputs), throttle=throttle)
    if not as_json:  # no SQLAlchemy import where the DB and the scheduler allow (ops/quicksweep.py)
        from orchestrator.ops import quicksweep

        quick = quicksweep.sweep(cfg, req)
        if quick is not None and quick.all_submitted:
            click.echo(_summary(name, quick.tasks, backend, throttle, {"submitted": quick.tasks}))
            return
    else:
        quick = None
    from orchestrator.core.db import Database
    from orchestrator.views.show import show_sweep

    db = Database(cfg)
    if quick is None:
        from orchestrator.ops.sweep import submit_sweep

        submit_sweep(db, cfg, req)
    if req.launch_deferred:
        click.echo(f"orch: warning: not launched yet ({req.launch_deferred}); `orch reconcile` launches the tasks",
                   err=True)
    d = show_sweep(db, name)
    if as_json:
        _emit(d)
        return
    click.echo(_summary(d["name"], d["tasks"], d["backend"], throttle, d["states"]))


def _summary(name: str, tasks: int, backend: str, throttle: int | None, states: dict[str, int]) -> str:
    return (f"sweep {name}: {tasks} tasks on {backend}" + (f", at most {throttle} at once" if throttle else "") + "; "
            + ", ".join(f"{n} {st}" for st, n in states.items()))
