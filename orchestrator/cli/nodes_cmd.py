"""``orch nodes``: suspect nodes and the evidence against them; ``--clear NAME`` ends one's exclusion
(the rule is in orchestrator/decide/suspects.py)."""

from __future__ import annotations

import click

from orchestrator.cli.app import _ctx, _emit, main


@main.command()
@click.option("--json", "as_json", is_flag=True, help="The suspects as a JSON list.")
@click.option("--clear", "clear_node", metavar="NAME",
              help="End NAME's exclusion now: the failures before it no longer count against it.")
def nodes(as_json: bool, clear_node: str | None) -> None:
    """Nodes kept out of new attempts (Slurm --exclude): K different jobs failed on each (crash, node_fail,
    hang, killed) within the window; each is excluded until EXCLUDED_UNTIL. ``[nodes]`` in orch.toml sets
    K, the window and how long. Exit 2 for --clear of a name that is not an excluded node (nothing written).
    """
    from orchestrator.decide.suspects import NODE_NAME_RE, all_suspects, clear_anywhere

    if clear_node is not None:
        from orchestrator.errors import UsageError

        if not NODE_NAME_RE.match(clear_node):  # before the DB is even opened
            raise UsageError(f"--clear {clear_node!r}: not a node name")
        cfg, db = _ctx()
        clear_anywhere(db, cfg, clear_node)
        click.echo(f"cleared {clear_node} (its exclusion ends now)")
        return
    cfg, db = _ctx()
    rows = all_suspects(db, cfg)
    if as_json:
        _emit(rows)
        return
    if not rows:
        click.echo("no suspect nodes")
        return
    click.echo(f"{'NODE':<20} {'BACKEND':<8} {'EXCLUDED_UNTIL':<26} JOBS")
    for r in rows:
        click.echo(f"{r['node']:<20} {r['backend']:<8} {r['excluded_until']:<26} {','.join(r['jobs'])}")
        for e in r["evidence"]:
            click.echo(f"    {e['at']}  {e['job']} attempt {e['attempt']}: {e['class']} on {e['nodes']}")
