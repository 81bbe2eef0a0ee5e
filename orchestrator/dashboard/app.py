"""The dashboard's pages: the jobs (one page of them, filtered and sorted in the URL), a job (its attempts with
the cause of each end, the loss curve, goodput, checkpoints, events, the tail of its logs) and the fleet (``orch
report``'s goodput by partition and by sweep, the top badput causes, the suspect nodes). Every route is a GET; the
views it calls are ``orch status``'s, ``orch show``'s, ``orch report``'s and ``orch nodes``', through a read-only
database."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

from orchestrator import protocol
from orchestrator.core.config import Config
from orchestrator.core.db import Database
from orchestrator.core.goodput import summarize
from orchestrator.dashboard.queries import (
    MAX_PER_PAGE,
    PER_PAGE,
    SORTS,
    STATES,
    Filters,
    jobs_page,
    split_of,
    sweep_tasks,
)
from orchestrator.dashboard.security import Guard
from orchestrator.dashboard.svg import goodput_svg, loss_svg, timeline_svg
from orchestrator.decide.suspects import all_suspects
from orchestrator.errors import JobNotFound, UsageError
from orchestrator.views.goodputview import dur, goodput_over_time, parse_since, report_of, report_splits, summary_lines
from orchestrator.views.losscurve import loss_curve
from orchestrator.views.show import show_job, show_sweep

HERE = Path(__file__).resolve().parent
STATIC = {"style.css": "text/css"}  # the only files served: no path is ever joined
LOG_TAIL_BYTES = 16 * 1024
CHECKPOINTS_SHOWN = 20
REFRESH_S = 15
FLEET_SINCE = "7d"  # the fleet page's window by default: `orch report`'s, and the Prometheus gauges'
MAX_PAGE = 10**6


class BadQuery(ValueError):
    """A URL parameter the page cannot take (answered 400, one line)."""


def since_of(text: str) -> timedelta:
    """A ``since`` URL parameter (7d, 12h, ...) as ``orch report --since`` takes it (at most 100 years: 999999w
    overflowed datetime, a 500); a BadQuery otherwise."""
    try:
        since = parse_since(text)
    except UsageError as e:
        raise BadQuery(str(e).replace("--since", "since")) from None
    return since


def filters_of(q: Any) -> Filters:
    """The jobs page's URL parameters, validated: 400 for a state that is none, a bad ``since`` or page."""
    state = q.get("state") or None
    if state is not None and state not in STATES:
        raise BadQuery(f"state {state[:40]!r}: one of {', '.join(STATES)}")
    sort = q.get("sort") or "new"
    if sort not in SORTS:
        raise BadQuery(f"sort {sort[:40]!r}: one of {', '.join(SORTS)}")
    since = since_of(q["since"]) if q.get("since") else None
    try:
        page, per = int(q.get("page") or 1), int(q.get("per") or PER_PAGE)
    except ValueError:
        raise BadQuery("page and per are whole numbers") from None
    if not 1 <= page <= MAX_PAGE or not 1 <= per <= MAX_PER_PAGE:  # page=10**19 overflowed SQLite's INTEGER: a 500
        raise BadQuery(f"1 <= page <= {MAX_PAGE} and 1 <= per <= {MAX_PER_PAGE}")
    return Filters(state=state, name=(q.get("name") or None), backend=(q.get("backend") or None),
                   partition=(q.get("partition") or None), sweep=(q.get("sweep") or None), since=since, sort=sort,
                   page=page, per=per)


def tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str | None:
    """The last ``limit`` bytes of a log as text; None for a symlink, FIFO or directory there (never followed or
    blocked on), or none at all."""
    got = protocol.read_tail(path, limit)
    return None if got is None else got[0].decode("utf-8", "replace")


def checkpoints(run_dir: str) -> list[dict[str, Any]]:
    """The newest committed checkpoints, each with its manifest checked (sizes and names; ``orch verify`` hashes
    every file)."""
    out = []
    for i, d in enumerate(protocol.iter_checkpoint_dirs(run_dir)):
        if i >= CHECKPOINTS_SHOWN:
            break
        problem = protocol.verify_checkpoint(d, hashes=False)
        out.append({"name": d.name, "step": protocol.checkpoint_step(d), "ok": problem is None, "problem": problem})
    return out


def make_app(db: Database, cfg: Config, token: str | None, loopback_only: bool) -> Any:
    """The ASGI app: the pages behind the access guard (``security``)."""
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True)

    def render(name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        ctx.setdefault("refresh_s", REFRESH_S)
        ctx["updated"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        return HTMLResponse(env.get_template(name).render(**ctx), status_code=status)

    def problem(status: int, text: str) -> HTMLResponse:
        return render("problem.html", status=status, text=text, refresh_s=None)

    def jobs(request: Request) -> Response:
        try:
            f = filters_of(request.query_params)
        except BadQuery as e:
            return problem(400, str(e))
        page = jobs_page(db, cfg, f)
        kept = {k: v for k, v in request.query_params.items() if k in ("state", "name", "backend", "partition",
                                                                       "sweep", "since", "sort", "per") and v}

        def link(**change: Any) -> str:
            q = {**kept, **{k: v for k, v in change.items() if v is not None}}
            q = {k: v for k, v in q.items() if v not in ("", None) and not (k == "page" and v == 1)}
            for k, v in change.items():
                if v is None:
                    q.pop(k, None)
            return "/?" + urlencode(q) if q else "/"

        pages = max(1, -(-page.total // f.per))
        return render("jobs.html", page=page, f=f, states=STATES, sorts=list(SORTS), link=link, pages=pages, dur=dur,
                      since_text=request.query_params.get("since"))

    def job(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            d = show_job(db, name, events=True)
        except JobNotFound:
            return problem(404, f"no job named {name[:200]!r}")
        curve = loss_curve(db, name)
        logs = []
        if d["attempts"]:
            adir = protocol.attempt_dir(d["run_dir"], d["attempts"][-1]["n"])
            # O_NOFOLLOW guards the log's own name only: a job that made attempts/ or attempts/<n> a symlink
            # would have a file outside the runs root served as its log
            inside = not (adir.is_symlink() or adir.parent.is_symlink())
            logs = [(name, tail(adir / name) if inside else None) for name in (protocol.STDOUT_LOG,
                                                                               protocol.STDERR_LOG)]
        return render("job.html", d=d, curve=Markup(loss_svg(curve)), marks=curve["marks"], logs=logs,
                      checkpoints=checkpoints(d["run_dir"]), timeline=Markup(timeline_svg(d.get("goodput"))))

    def fleet(request: Request) -> Response:
        text = request.query_params.get("since") or FLEET_SINCE
        try:
            since = since_of(text)
        except BadQuery as e:
            return problem(400, str(e))
        now = time.time()
        splits = report_splits(db, since, now, split_of)  # refreshed every 15 s: ended jobs' splits kept
        over = Markup(goodput_svg(goodput_over_time(splits, since, now)))
        return render("fleet.html", rep=report_of(splits, since), over_time=over, since_text=text,
                      suspects=all_suspects(db, cfg), dur=dur, summary_lines=summary_lines)

    def sweep(request: Request) -> Response:
        name = request.path_params["name"]
        got = sweep_tasks(db, name)
        if got is None:
            return problem(404, f"no sweep named {name[:200]!r}")
        tasks, splits = got
        sw = show_sweep(db, name)
        if sw is None:  # deleted between the two reads
            return problem(404, f"no sweep named {name[:200]!r}")
        params = sw["params"]
        for t in tasks:
            i = t["task_index"]
            t["params"] = json.dumps(params[i], sort_keys=True) if i is not None and 0 <= i < len(params) else ""
        return render("sweep.html", sw=sw, tasks=tasks, total=summarize(splits), dur=dur,
                      summary_lines=summary_lines)

    def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return PlainTextResponse("not found\n", status_code=404)
        return FileResponse(HERE / "static" / name, media_type=STATIC[name])

    routes = [Route("/", jobs, methods=["GET"]), Route("/jobs/{name:path}", job, methods=["GET"]),
              Route("/fleet", fleet, methods=["GET"]), Route("/sweeps/{name:path}", sweep, methods=["GET"]),
              Route("/static/{name}", static, methods=["GET"])]
    return Guard(Starlette(routes=routes), token, loopback_only)
