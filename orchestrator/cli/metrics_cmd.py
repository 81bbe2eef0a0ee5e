"""``orch metrics``: the job table in Prometheus text format (stdout, or node_exporter's textfile dir)."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.app import _ctx, main


@main.command()
@click.option("--textfile", "textfile_dir", metavar="DIR",
              type=click.Path(exists=True, file_okay=False, dir_okay=True, writable=True, path_type=Path),
              help="Write DIR/orch.prom atomically (node_exporter's --collector.textfile.directory) "
                   "instead of printing.")
def metrics(textfile_dir: Path | None) -> None:
    """Jobs by state, attempts by failure class, last success time, steps redone per preemption,
    and the last reconcile pass's duration and scheduler query failures (Prometheus text format).

    Set ``[metrics] textfile_dir`` in orch.toml (or ORCH_METRICS_TEXTFILE_DIR) to have every
    reconcile pass rewrite the file.
    """
    from orchestrator.core.config import load_config
    from orchestrator.views.metrics import collect, quick_collect, render, write_textfile

    snap = quick_collect(load_config())  # no SQLAlchemy import, as `orch status` (views.status)
    if snap is None:
        _cfg, db = _ctx()
        snap = collect(db)
    text = render(snap)
    if textfile_dir is None:
        click.echo(text, nl=False)
        return
    from orchestrator.errors import UsageError

    # /dev/null or /proc passed click's directory check and ended in "unexpected error" (a hostile test).
    if not textfile_dir.is_dir():
        raise UsageError(f"--textfile {str(textfile_dir)[:200]}: not a directory")
    try:
        write_textfile(textfile_dir.absolute(), text)
    except OSError as e:
        raise UsageError(f"--textfile {str(textfile_dir)[:200]}: cannot write orch.prom there: "
                         f"{e.strerror or e}") from None
