"""Read commands: status, show, verify, logs. They import no torch, no submitit, no Alembic."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.app import EXIT_NOT_VERIFIED, STATES, _ctx, _emit, _show, main

STATUS_SINCE = "24h"


@main.command()
@click.option("--state", type=click.Choice(STATES), help="Only jobs in this state.")
@click.option("--since", "since", default=STATUS_SINCE, show_default=True, metavar="AGE",
              help="Also the jobs that ended (done_marker_verified, failed, cancelled) in the last AGE (30m, 12h, "
                   "7d, 2w); 'all' for every job, however long ago it ended. Live jobs are always shown.")
@click.option("--tasks", is_flag=True, help="One row per sweep task instead of one per sweep.")
@click.option("--json", "as_json", is_flag=True, help="The jobs shown (sweep tasks too) as a JSON list; how many "
                                                        "older ones were left out goes to stderr.")
def status(state: str | None, since: str, tasks: bool, as_json: bool) -> None:
    """One row per job (and per sweep): state, attempts, backend id of the latest attempt, progress.

    Shows the live jobs and those that ended in the last 24 hours (``--since``), and says how many older ones it
    left out: a history of 100,000 finished jobs took 3.6 s to list. A sweep with a task shown is shown whole."""
    from datetime import UTC, datetime

    from orchestrator.core.config import load_config
    from orchestrator.views.goodputview import parse_since
    from orchestrator.views.status import group_by_sweep, quick_status_rows

    window = None if since == "all" else parse_since(since)  # checked before the DB is opened
    cutoff = None if window is None else datetime.now(UTC).replace(tzinfo=None) - window
    found = quick_status_rows(load_config(), state, cutoff)  # no SQLAlchemy import (login-node latency)
    if found is None:
        found = _status_slow_path(state, cutoff)
    rows, total = found
    older = total - len(rows)
    left_out = (f"{older:,} job{'s' if older != 1 else ''}" + (f" in state {state}" if state else "")
                + f" that ended before the last {since} not shown (orch status --since all)") if older > 0 else ""
    if as_json:
        _emit(rows)
        if left_out:
            click.echo(f"orch status: {left_out}", err=True)
        return
    if not tasks:
        rows = group_by_sweep(rows)
    if not rows:
        click.echo("no jobs" + (f" in state {state}" if state else "") + (f"; {left_out}" if left_out else ""))
        return
    cols = [("NAME", "name"), ("STATE", "state"), ("ATT", "attempts"), ("BACKEND", "backend"),
            ("JOB ID", "external_id"), ("STEP", "step"), ("CLASS", "failure_class"), ("FLAGS", "flags")]
    table = [[h for h, _ in cols]] + [[_cell(_state_cell(r) if k == "state" else r.get(k)) for _, k in cols]
                                      for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    # one write: click.echo per row cost ~20 ms for 1,000 jobs (it checks the stream on every call)
    click.echo("\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table)
               + (f"\n({left_out})" if left_out else ""))


def _status_slow_path(state: str | None, cutoff: Any) -> tuple[list[dict[str, Any]], int]:
    """Through SQLAlchemy (creates or upgrades the DB, tightens ORCH_HOME, names any problem), after
    which the next ``orch status`` can take the quick path."""
    from orchestrator.views.show import status_rows
    from orchestrator.views.status import drop_legacy_cache

    cfg, db = _ctx()
    found = status_rows(db, cfg, state, cutoff)
    drop_legacy_cache(cfg)
    return found


def _state_cell(r: dict[str, Any]) -> str:
    """The job's state, and ``(stopping)`` while its latest attempt was asked to stop and may still run."""
    return r["state"] + (" (stopping)" if r.get("attempt_state") == "stopping" else "")


def _cell(v: Any) -> str:
    if v is None or v == []:
        return "-"
    if isinstance(v, list):
        return ",".join(map(str, v))
    return str(v)


@main.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@click.option("--events", is_flag=True, help="Also the history: every move of the job and of each attempt.")
def show(name: str, as_json: bool, events: bool) -> None:
    """A job and every attempt: backend id, state, failure class, action taken, times (or a sweep:
    its counts and tasks). ``--events``: also every move of the job and its attempts, oldest first."""
    from orchestrator.views.show import show_sweep

    _cfg, db = _ctx()
    sw = show_sweep(db, name, events=events)
    if sw is not None:
        if as_json:
            _emit(sw)
            return
        _say(f"{sw['name']}: sweep of {sw['tasks']} tasks on {sw['backend']}"
                   + (f", at most {sw['throttle']} at once" if sw["throttle"] else ""))
        _say("  " + ", ".join(f"{n} {st}" for st, n in sw["states"].items()))
        for t in sw["task_list"]:
            _say(f"  {t['name']}: {t['state']}  {json.dumps(sw['params'][t['task']], sort_keys=True)}")
        if events:
            _say_events(sw["events"])
        return
    d = _show(db, name, events=events)
    if as_json:
        _emit(d)
        return
    _say(f"{d['name']}: {d['state']}  backend={d['backend']}  run_dir={d['run_dir']}")
    _say(f"  command: {' '.join(d['command'])}")
    if d.get("last_step") is not None:
        _say(f"  last step: {d['last_step']}")
    pre = d.get("preemptions") or {}
    if pre.get("total"):
        _say(f"  preemptions: {pre['total']}" + (f" ({pre['in_place']} requeued in place by the scheduler)"
                                                      if pre.get("in_place") else ""))
    if d.get("held"):
        _say(f"  {d['held']}")
    if d.get("overrides"):
        _say(f"  overrides for the next attempt: {json.dumps(d['overrides'], sort_keys=True)}")
    if (mlflow := (d.get("trackers") or {}).get("mlflow")):
        _say(f"  MLflow run: {mlflow['run_id']} at {mlflow['tracking_uri']}"
             + (f" ({mlflow['end']})" if mlflow.get("end") else ""))
    if (wandb := (d.get("trackers") or {}).get("wandb")):
        where = "/".join(p for p in (wandb["entity"], wandb["project"]) if p)
        _say(f"  W&B run: {wandb['run_id']}" + (f" in {where}" if where else "") + f" ({wandb['mode']})"
             + (f", marked {wandb['end']}" if wandb.get("end") else ""))
    gp = _goodput_lines(d.get("goodput"))
    for line in gp.pop(0) if gp else []:
        _say(f"  {line}")
    for a in d["attempts"]:
        fields = [f"id={_cell(a['external_id'])}", f"class={_cell(a['failure_class'])}",
                  f"step={_cell(a['failure_step'] if a['failure_step'] is not None else a.get('last_step'))}",
                  f"exit={_cell(a['exit_code'])}",
                  f"restarts={a['restarts']}" + _restarts_note(a.get("restart_history") or [])]
        if a.get("world_size") or a.get("nodes"):
            fields.append(f"ranks={_cell(a.get('world_size'))}  nodes={_cell(a.get('nodes'))}")
        _say(f"  attempt {a['n']}: {a['state']}  " + "  ".join(fields))
        if a.get("detail"):
            _say(f"    detail: {a['detail']}")
        if a.get("rank_restarts"):
            _say(f"    rank restarts in the allocation: {len(a['rank_restarts'])} ("
                 + "; ".join(_rank_restart_text(r) for r in a["rank_restarts"]) + ")")
        if a.get("trained_again"):
            first, last = a["trained_again"]
            _say(f"    trained again: steps {first}..{last} at least (attempt {a['n'] - 1} had reached them; W&B keeps "
                 "its values for them)")
        if a.get("stale_age_s") is not None:
            from orchestrator.decide.staleness import Stale

            stale = Stale(a.get("stale_rank"), a["stale_age_s"], a.get("stale_step"))
            _say(f"    hang stop: {stale.describe()}")
        if a.get("stop_reason") and a["state"] == "stopping":
            _say(f"    stopping since {a['stop_requested_at']} ({a['stop_reason']})")
        if a.get("action"):
            act = {k: v for k, v in a["action"].items() if v not in (None, "", [], {}, False)}
            _say(f"    action: {json.dumps(act, sort_keys=True)}")
        for t in a.get("trashed") or []:
            _say(f"    moved to trash at launch: {t.get('path')} ({t.get('why') or 'no reason recorded'})")
        for t in a.get("set_aside") or []:
            _say(f"    set aside at launch: {t.get('path')} -> {t.get('as')} ({t.get('why')})")
        for line in gp.pop(0) if gp else []:
            _say(f"    {line}")
    if d.get("foreign_checkpoint_files"):
        _say(f"  left in place (not orch's): checkpoints/{', checkpoints/'.join(d['foreign_checkpoint_files'])}")
    for problem in d.get("problems") or []:
        _say(f"  problem: {problem}")
    if events:
        _say_events(d["events"])


def _rank_restart_text(r: dict[str, Any]) -> str:
    """One rank restart: ``killed: rank 1 ended -9 at step 47, resumed from step 40``."""
    who = "" if r.get("failed_rank") is None else f"rank {r['failed_rank']} ended {_cell(r.get('rank_returncode'))} "
    if r.get("lost_nodes"):
        who = f"node(s) {','.join(r['lost_nodes'])} lost "
    return (f"{r['class']}: {who}at step {_cell(r.get('failed_step'))}, resumed from step "
            f"{_cell(r.get('resume_step') or 0)}")


def _say_events(events: list[dict[str, Any]]) -> None:
    """One line per event: when, whose (the job, an attempt; a sweep's task first), the move or note, why."""
    _say("  events:")
    for e in events:
        who = "job" if e["attempt"] is None else f"attempt {e['attempt']}"
        who = f"{e['task']} {who}" if e.get("task") else who
        move = f"{e['from'] or '(created)'} -> {e['to']}" if e["from"] != e["to"] else "note"
        _say(f"    {e['at']}  {who}: {move}" + (f"  ({e['reason']})" if e["reason"] else ""))


def _goodput_lines(g: dict[str, Any] | None) -> list[Any]:
    """[job's summary lines, then one line per attempt]: where the held time went (docs/guides/goodput.md)."""
    if not g:
        return []
    from orchestrator.views.goodputview import dur, split_line, summary_lines

    out: list[Any] = [summary_lines(g)]
    for a in g["attempts"]:
        steps = (f"; {a['steps_computed']} steps, {a['steps_redone']} redone later, "
                 f"{dur(a['step_time_s'])}/step" if a["steps_computed"] else "")
        runs = a.get("runs") or 1
        held = f"held {dur(a['held_s'])}" + (f" in {runs} runs" if runs > 1 else "") + \
            (" (the scheduler's account)" if a.get("held_from") == "scheduler" else "")
        out.append([f"{held}: {split_line(a['seconds'], a['held_s'])}{steps}",
                    *(f"  goodput note: {x}" for x in a.get("assumptions") or [])])
    return out


def _say(line: str) -> None:
    """One line of ``orch show``'s text, job-written parts included (failure.json's detail, exit.json's
    fields, the backend's state): every non-printable character escaped. A detail holding ESC [2J
    cleared the reader's terminal, and a CR overwrote the line before it."""
    click.echo(printable(line))


def printable(text: str) -> str:
    """``text`` with each non-printable character (control characters, C1 codes such as U+009B, newlines)
    written as its Python escape, so it shows as text and never acts on a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


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
    click.echo(printable(str(v)))  # its reasons quote done.json, which the job wrote
    sys.exit(0 if v.verified else EXIT_NOT_VERIFIED)


def _run_dir_of(name: str) -> Path:
    from orchestrator.core.jobqueries import get_job
    from orchestrator.errors import JobNotFound

    cfg, db = _ctx()
    try:
        with db.read() as s:
            return Path(get_job(s, name).run_dir)
    except JobNotFound as e:
        from orchestrator.core.rundir import run_dir_for
        from orchestrator.protocol import UnsafePath

        try:
            p = run_dir_for(cfg, name)
        except UnsafePath:  # `orch verify -` was an "unexpected error" (exit 1); it is no job: exit 2
            raise e from None
        if not p.exists():
            raise
        return p


@main.command()
@click.argument("name")
@click.option("--attempt", type=click.IntRange(1, None), help="Attempt number (default: the latest).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the attempt ends.")
def logs(name: str, attempt: int | None, follow: bool) -> None:
    """The stdout and stderr of one attempt of NAME."""
    from orchestrator.views.show import log_paths

    cfg, db = _ctx()
    paths, live = log_paths(db, name, attempt)
    if not follow:
        for p in paths:
            chunk, _pos = _read_from(p, 0)
            if chunk is not None:
                click.echo(f"==> {p} <==")
                sys.stdout.write(chunk)
        return
    out = paths[0]
    pos = 0
    while True:
        chunk, pos = _read_from(out, pos)
        if chunk:
            sys.stdout.write(chunk)
            sys.stdout.flush()
        if not live():
            return
        time.sleep(1.0)


def _read_from(path: Path, pos: int) -> tuple[str | None, int]:
    """Text of a log from ``pos`` on; None when it is absent or not a regular file (a job can put a
    FIFO there, and a blocking open would hang `orch logs`)."""
    from orchestrator.protocol.durable import open_regular

    try:
        f = open_regular(path)
    except OSError:
        return None, pos
    if f is None:
        return None, pos
    with f:
        f.seek(pos)
        data = f.read()
        return data.decode(errors="replace"), pos + len(data)


def _restarts_note(history: list[dict]) -> str:
    """`` (preempted at step 1358)`` for each in-place restart, newest last: why the attempt ran again."""
    if not history:
        return ""
    parts = [r["class"] + (f" at step {r['step']}" if r.get("step") is not None else "") for r in history]
    return f" ({', '.join(parts)})"


@main.command()
@click.option("--since", "since", default="7d", show_default=True, metavar="AGE",
              help="Jobs created, or with an attempt running or ended, in the last AGE (30m, 12h, 7d, 2w); 'all' "
                   "for every job.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: fleet, by_partition, by_sweep.")
def report(since: str, as_json: bool) -> None:
    """Goodput of the fleet: where held machine time went (useful, lost work, startup, save stall, hang
    detection, teardown, failed attempts; waiting between attempts), by partition and by sweep, with
    preemptions per held hour, mean time between unsignalled failures and the largest badput causes."""
    from orchestrator.views.goodputview import dur, parse_since, summary_lines
    from orchestrator.views.goodputview import report as build

    window = None if since == "all" else parse_since(since)  # checked before the DB is opened
    from orchestrator.core.config import load_config
    from orchestrator.views.goodputquick import quick_report

    rep = quick_report(load_config(), window)  # no SQLAlchemy import, as `orch status` (views.status)
    if rep is None:
        _cfg, db = _ctx()
        rep = build(db, window)
    if as_json:
        _emit(rep)
        return
    f = rep["fleet"]
    if not f["jobs"]:
        click.echo(f"no jobs in the last {since}" if window else "no jobs")
        return
    lines = [f"fleet ({f['jobs']} jobs, since {since}): " + summary_lines(f)[0], "  " + summary_lines(f)[1],
             _rates(f)]
    lines += ["top badput: " + ("; ".join(f"{c['category']} ({c['cause']}) {dur(c['seconds'])}"
                                          for c in f["top_badput"]) or "-")]
    lines += ["waiting (not held): " + ("; ".join(f"{w['cause']} {dur(w['seconds'])}" for w in f["waiting_by_cause"])
                                        or "-")]
    for title, key in (("partition", "by_partition"), ("sweep", "by_sweep")):
        for name, g in rep[key].items():
            lines += [f"{title} {name} ({g['jobs']} jobs): " + summary_lines(g)[0], "  " + summary_lines(g)[1],
                      "  " + _rates(g)]
    click.echo("\n".join(printable(line) for line in lines))  # names are the user's: escaped, line by line


def _rates(g: dict[str, Any]) -> str:
    from orchestrator.views.goodputview import dur

    pph = g["preemptions_per_hour"]
    return (f"preemptions {g['preemptions']} ({pph:.2f}/held h)" if pph is not None else "preemptions 0") + \
        f"; unsignalled failures {g['unsignalled_failures']}, mean time between: {dur(g['mtbf_unsignalled_s'])}"
