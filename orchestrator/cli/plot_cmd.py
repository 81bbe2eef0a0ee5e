"""``orch plot NAME``: the loss curve across every attempt, with resume, NaN-rollback and preemption
points marked. A read command: no reconcile pass, no torch; matplotlib only when a picture is drawn."""

from __future__ import annotations

import re
from pathlib import Path

import click

from orchestrator.cli.app import _ctx, _emit, main


def _size(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d{2,5})x(\d{2,5})", value)
    if not m or not all(100 <= int(v) <= 10000 for v in m.groups()):
        raise click.BadParameter(f"{value[:40]!r}: want WIDTHxHEIGHT in pixels, each 100..10000")
    return int(m.group(1)), int(m.group(2))


@main.command()
@click.argument("name")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Image file (format from its suffix; default NAME-loss.png here).")
@click.option("--size", default="1000x500", show_default=True, callback=_size, help="WIDTHxHEIGHT in pixels.")
@click.option("--json", "as_json", is_flag=True, help="Print the series and the marked points instead.")
def plot(name: str, output: Path | None, size: tuple[int, int], as_json: bool) -> None:
    """Draw the loss of job NAME over all its attempts (from their progress history), with each
    resume, NaN rollback and preemption marked. Needs the plot extra (matplotlib) unless --json."""
    from orchestrator.views.losscurve import loss_curve

    _cfg, db = _ctx()
    curve = loss_curve(db, name)
    if as_json:
        _emit(curve)
        return
    from orchestrator.errors import UsageError
    from orchestrator.views.plot import draw

    path = output if output is not None else Path(f"{name}-loss.png")
    if not path.parent.is_dir():
        raise UsageError(f"no such directory: {str(path.parent)[:200]}")
    # The picture is renamed into place: over a device node or a symlink (`-o /dev/stdout` as root) that
    # replaced the system's /dev/stdout for every process (found by a hostile test). Only a new name or a
    # regular file may be replaced.
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise UsageError(f"-o {str(path)[:200]}: not a regular file; name a new file or an image to replace")
    draw(curve, path, *size)
    points = sum(len(s["points"]) for s in curve["series"])
    click.echo(f"{path}: {points} points over {len({s['attempt'] for s in curve['series']})} attempts, "
               f"{len(curve['marks'])} marked")
