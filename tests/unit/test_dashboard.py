"""``orch dashboard``'s pages and its guard, through Starlette's test client (the real app, the real views, a real
database; the scheduler is the shared fake). What a person sees in a browser is tests/browser's."""

from __future__ import annotations

import html

import pytest
from starlette.testclient import TestClient

from orchestrator import protocol
from orchestrator.dashboard.app import make_app
from orchestrator.dashboard.readonly import ReadOnlyDatabase
from orchestrator.errors import DatabaseProblem
from orchestrator.ops.reconcile import reconcile_pass
from orchestrator.ops.submit import SubmitRequest, submit

TOKEN = "t0ken-for-the-tests-0123456789"


def _fleet(db, cfg, sched) -> None:
    """ok: verified; bad: crashed (job-written text with markup in its detail and its log); live: running."""
    for name in ("ok", "bad", "live"):
        submit(db, cfg, SubmitRequest(name=name, command=["true"], max_attempts=1,
                                      outputs=["o.txt"] if name == "ok" else []))
    (cfg.runs_root / "ok" / "o.txt").write_text("x\n")
    protocol.write_done_marker(cfg.runs_root / "ok", "ok", 1, ["o.txt"])
    sched.ended.update(ok=0, bad=1)
    adir = protocol.attempt_dir(cfg.runs_root / "bad", 1)
    adir.mkdir(parents=True, exist_ok=True)
    (adir / protocol.STDERR_LOG).write_text("Traceback\n<script>alert('log')</script>\n")
    protocol.atomic_write_json(adir / "failure.json", {"class": "crash", "message": "<script>alert('x')</script>"})
    reconcile_pass(db, cfg, backend_for=lambda _n: sched)


def _client(cfg, token=None, loopback=True, host="127.0.0.1:8080") -> TestClient:
    return TestClient(make_app(ReadOnlyDatabase(cfg), cfg, token, loopback), base_url=f"http://{host}",
                      follow_redirects=False)


@pytest.mark.each_db  # the read-only engine and the page's SQL on PostgreSQL too
def test_the_jobs_page_lists_every_job_with_its_state_and_the_cause_of_each_attempts_end(db, cfg, sched):
    _fleet(db, cfg, sched)
    r = _client(cfg).get("/")
    assert r.status_code == 200, r.text
    for name in ("ok", "bad", "live"):
        assert f'href="/jobs/{name}"' in r.text
    assert "failed 1</a>" in r.text and "running 1</a>" in r.text  # the state chips' counts
    assert 'class="cause c-crash"' in r.text and 'class="cause c-running"' in r.text
    assert "3 jobs" in r.text


def test_filters_and_paging_are_in_the_url_and_done_in_sql(db, cfg, sched):
    _fleet(db, cfg, sched)
    c = _client(cfg)
    r = c.get("/?state=failed")
    assert 'href="/jobs/bad"' in r.text and 'href="/jobs/ok"' not in r.text and "1 job<" in r.text
    r = c.get("/?name=o&sort=name")
    assert r.text.index('href="/jobs/ok"') > 0 and 'href="/jobs/bad"' not in r.text  # "ok" only: "o" in it
    r = c.get("/?per=1&page=2&sort=name")
    assert 'href="/jobs/live"' in r.text and "page 2 of 3" in r.text
    assert 'href="/?per=1&amp;sort=name&amp;page=3"' in r.text  # the next page keeps the filters


@pytest.mark.parametrize("query, says", [
    ("state=bogus", "state 'bogus': one of"), ("sort=x", "sort 'x': one of"), ("since=3 weeks", "since '3 weeks'"),
    ("page=0", "1 <= page <= 1000000"), ("per=100000", "per <= 500"), ("page=x", "whole numbers"),
])
def test_a_bad_url_parameter_is_a_400_with_one_line_saying_why(db, cfg, sched, query, says):
    _fleet(db, cfg, sched)
    r = _client(cfg).get(f"/?{query}")
    assert r.status_code == 400 and says in html.unescape(r.text), r.text


def test_a_job_page_shows_its_attempts_causes_checkpoints_events_and_log_tail_with_job_text_escaped(db, cfg, sched):
    _fleet(db, cfg, sched)
    c = _client(cfg)
    r = c.get("/jobs/bad")
    assert r.status_code == 200
    assert 'id="attempts"' in r.text and 'class="cause c-crash"' in r.text and 'id="events"' in r.text
    assert "<script>" not in r.text  # job-written text (the failure's message, the log) is shown as text
    assert "&lt;script&gt;alert(&#39;log&#39;)&lt;/script&gt;" in r.text
    assert c.get("/jobs/nope").status_code == 404


def test_a_log_that_is_a_fifo_or_a_symlink_is_not_read(db, cfg, sched, tmp_path):
    import os

    _fleet(db, cfg, sched)
    adir = protocol.attempt_dir(cfg.runs_root / "bad", 1)
    (adir / protocol.STDERR_LOG).unlink()
    os.mkfifo(adir / protocol.STDERR_LOG)  # a reader that opened it blocking would hang the page
    secret = tmp_path / "secret.txt"
    secret.write_text("outside the runs root")
    (adir / protocol.STDOUT_LOG).symlink_to(secret)
    r = _client(cfg).get("/jobs/bad")
    assert r.status_code == 200 and "outside the runs root" not in r.text
    assert r.text.count("not there (or not a regular file)") == 2


@pytest.mark.each_db
def test_nothing_can_write_every_route_is_a_get_and_the_database_refuses_writes(db, cfg, sched):
    _fleet(db, cfg, sched)
    c = _client(cfg)
    for method in ("post", "put", "delete", "patch"):
        assert getattr(c, method)("/").status_code == 405
    ro = ReadOnlyDatabase(cfg)
    with pytest.raises(DatabaseProblem):
        with ro.write():
            pass
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    with ro.read() as s, pytest.raises(DBAPIError, match="readonly|read-only|query_only"):
        s.execute(text("UPDATE jobs SET name = 'x'"))


def test_only_the_stylesheet_is_served_no_path_from_the_url(db, cfg, sched):
    c = _client(cfg)
    assert c.get("/static/style.css").status_code == 200
    for path in ("/static/..%2fapp.py", "/static/app.py", "/static/%2e%2e/%2e%2e/orch.db"):
        assert c.get(path).status_code == 404


def test_every_answer_carries_the_security_headers(db, cfg, sched):
    for path in ("/", "/jobs/nope", "/static/style.css", "/?state=bogus"):
        h = _client(cfg).get(path).headers
        assert "default-src 'none'" in h["content-security-policy"] and h["x-content-type-options"] == "nosniff"
        assert h["x-frame-options"] == "DENY" and h["referrer-policy"] == "no-referrer"


def test_on_loopback_a_request_naming_another_host_is_refused(db, cfg, sched):
    """A page elsewhere that rebinds its DNS name to 127.0.0.1 would otherwise read the dashboard."""
    for host in ("evil.example:8080", "localhost.evil.example", "127.0.0.1.evil.example:8080"):
        r = _client(cfg, host=host).get("/")
        assert r.status_code == 403 and "localhost only" in r.text
    for host in ("localhost:8080", "127.0.0.2:8080", "[::1]:8080"):  # every loopback name it may be bound to
        assert _client(cfg, host=host).get("/").status_code == 200, host


def test_on_another_address_a_request_without_the_token_is_refused_and_the_token_opens_it(db, cfg, sched):
    c = _client(cfg, token=TOKEN, loopback=False, host="10.1.2.3:8080")
    for path in ("/", "/jobs/ok", "/static/style.css"):
        r = c.get(path)
        assert r.status_code == 401 and "needs its token" in r.text and TOKEN not in r.text
    assert c.get("/?token=wrong-token-of-the-same-size-00").status_code == 401
    r = c.get(f"/?state=failed&token={TOKEN}")
    assert r.status_code == 303 and r.headers["location"] == "/?state=failed"  # the token leaves the URL
    cookie = r.headers["set-cookie"]
    assert cookie.startswith("orch_dashboard_8080=")  # named by the port: two dashboards on one host keep theirs
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    r = c.get("/?state=failed")  # the cookie it set
    assert r.status_code == 200 and TOKEN not in r.text
    bare = _client(cfg, token=TOKEN, loopback=False, host="10.1.2.3:8080")
    assert bare.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_the_token_redirect_keeps_the_path_as_sent_and_never_leaves_the_server(db, cfg, sched):
    c = _client(cfg, token=TOKEN, loopback=False, host="10.1.2.3:8080")
    assert c.get(f"/jobs/a%3Fb?token={TOKEN}").headers["location"] == "/jobs/a%3Fb"
    # "//evil.example/" as the request target (the test client would read it as a host): the guard itself
    import asyncio

    from orchestrator.dashboard.security import Guard

    sent: list[dict] = []

    async def app(scope, receive, send):  # never reached: the guard answers
        raise AssertionError("the app ran")

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request"}

    scope = {"type": "http", "method": "GET", "path": "//evil.example/", "raw_path": b"//evil.example/",
             "query_string": f"token={TOKEN}".encode(), "headers": [(b"host", b"10.1.2.3:8080")],
             "server": ("10.1.2.3", 8080), "scheme": "http", "root_path": ""}
    asyncio.run(Guard(app, TOKEN, False)(scope, receive, send))
    assert dict(sent[0]["headers"])[b"location"] == b"/evil.example/"  # "//evil.example/" is another server


def test_a_websocket_is_refused_before_the_app():
    """No route takes one today; the guard closes it before any app code runs (a later route would be open)."""
    import asyncio

    from orchestrator.dashboard.security import Guard

    ran, sent = [], []

    async def app(scope, receive, send):
        ran.append(scope["type"])

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "websocket.connect"}

    asyncio.run(Guard(app, TOKEN, False)({"type": "websocket", "path": "/", "headers": []}, receive, send))
    assert ran == [] and sent == [{"type": "websocket.close", "code": 1008}]


@pytest.mark.parametrize("query, says", [("page=10000000000000000000", "1 <= page <= 1000000"),
                                         ("since=999999w", "at most 100 years")])
def test_a_huge_page_or_since_is_a_400_not_an_overflow(db, cfg, sched, query, says):
    r = _client(cfg).get(f"/?{query}")
    assert r.status_code == 400 and says in html.unescape(r.text), r.text


def test_a_symlinked_attempt_dir_is_not_followed_to_a_log_outside_the_runs_root(db, cfg, sched, tmp_path):
    _fleet(db, cfg, sched)
    adir = protocol.attempt_dir(cfg.runs_root / "bad", 1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / protocol.STDERR_LOG).write_text("a file outside the runs root")
    (adir / protocol.STDERR_LOG).unlink()
    adir.rmdir() if not any(adir.iterdir()) else __import__("shutil").rmtree(adir)
    adir.symlink_to(elsewhere)
    r = _client(cfg).get("/jobs/bad")
    assert r.status_code == 200 and "outside the runs root" not in r.text


def test_a_constant_huge_loss_draws_a_curve_not_a_division_by_zero():
    from orchestrator.dashboard.svg import loss_svg

    assert "<polyline" in loss_svg({"series": [{"attempt": 1, "points": [[1, 3e7], [2, 3e7]]}], "marks": []})


def test_a_token_file_must_hold_a_long_url_safe_token_and_none_is_generated_weaker(tmp_path):
    from orchestrator.dashboard.security import TOKEN_RE, load_token
    from orchestrator.errors import UsageError

    assert TOKEN_RE.fullmatch(load_token(None)) and len(load_token(None)) >= 40
    f = tmp_path / "token"
    for bad in ("short", "a+b&c#d%e-0123456789", "ünïcødé-0123456789"):
        f.write_text(bad + "\n")
        with pytest.raises(UsageError, match="at least 16 characters"):
            load_token(f)
    f.write_text(TOKEN + "\n# a comment line\n")
    assert load_token(f) == TOKEN


def test_the_fleet_page_shows_goodput_by_partition_the_top_badput_and_the_suspect_nodes_with_evidence(
        db, cfg, monkeypatch):
    """`orch report`'s fleet view and `orch nodes`' suspects on one page: three jobs crashed on the same two nodes."""
    from orchestrator.decide import suspects
    from tests.unit.test_suspects import _node_scheduler, _three_jobs_crash

    sched = _node_scheduler(monkeypatch, frozenset({"gpu01", "gpu02", "gpu03"}))
    monkeypatch.setattr(suspects, "node_backends", lambda: ["fakeslurm"])  # the fake is no registered backend
    _three_jobs_crash(db, cfg, sched)
    c = _client(cfg)
    r = c.get("/fleet")
    assert r.status_code == 200, r.text
    assert 'id="fleet-summary">3 jobs: goodput' in r.text and "the last 7d" in r.text
    part = r.text[r.text.index('id="by-partition"'):r.text.index('id="by-sweep"')]
    assert "<td>fakeslurm/-</td>" in part and '<td class="num">3</td>' in part
    top = r.text[r.text.index('id="top-badput"'):r.text.index('id="by-partition"')]
    assert 'class="cause c-crash"' in top
    nodes = r.text[r.text.index('id="suspects"'):]
    for node in ("gpu01", "gpu02"):
        assert f"<td>{node}</td><td>fakeslurm</td>" in nodes
    assert all(f'href="/jobs/{j}"' in nodes for j in "abc") and "gpu03" not in nodes
    assert c.get("/fleet?since=12h").status_code == 200
    r = c.get("/fleet?since=soon")
    assert r.status_code == 400 and "since 'soon': expected a number and a unit" in html.unescape(r.text)


def test_the_fleet_page_of_an_empty_table_says_so(db, cfg):
    r = _client(cfg).get("/fleet")
    assert r.status_code == 200 and "no jobs in the last 7d" in r.text and "none: no node is excluded" in r.text


@pytest.mark.each_db  # the partition filter's LIKE on the stored JSON text, on PostgreSQL too
def test_each_row_has_its_goodput_and_partition_and_the_partition_filter_is_in_the_url(db, cfg, sched):
    from orchestrator.core.jobqueries import get_job

    _fleet(db, cfg, sched)
    with db.write() as s:
        get_job(s, "ok").resources = {"partition": "spot"}  # at the top level, as older orch stored it
        get_job(s, "bad").resources = {"extras": {"partition": "gpu"}}  # under extras, as submit stores it now
    c = _client(cfg)
    r = c.get("/")

    def row(name: str) -> str:
        return r.text[r.text.index(f'href="/jobs/{name}"'):].split("</tr>")[0]

    assert '<td class="num goodput">100 %</td>' in row("ok") and '<td class="num badput">0.000 s</td>' in row("ok")
    assert '<td class="num goodput">0 %</td>' in row("bad")  # crashed with no heartbeat: all its held time badput
    assert "<td>local/spot</td>" in row("ok") and "<td>local/gpu</td>" in row("bad") and "<td>local/-</td>" in row(
        "live")
    for part, shown in (("spot", "ok"), ("gpu", "bad")):
        r = c.get(f"/?partition={part}")
        assert [n for n in ("ok", "bad", "live") if f'href="/jobs/{n}"' in r.text] == [shown] and "1 job<" in r.text
        assert f'name="partition" value="{part}"' in r.text
    r = c.get("/?partition=sp%25t")  # a LIKE wildcard in the value is a character, not a pattern
    assert r.status_code == 200 and "0 jobs" in r.text


def test_an_ended_jobs_goodput_is_read_from_its_files_once_a_live_ones_on_every_page(db, cfg, sched, monkeypatch):
    """A page refreshes every 15 s: an ended job's heartbeat histories (up to 8 MiB an attempt) are read once."""
    from orchestrator.dashboard import queries

    _fleet(db, cfg, sched)
    queries._ENDED_SPLITS.clear()
    reads: list[str] = []
    real = queries.job_split
    monkeypatch.setattr(queries, "job_split",
                        lambda job, now, *beats: reads.append(job.name) or real(job, now, *beats))
    c = _client(cfg)
    for _ in range(3):
        assert c.get("/").status_code == 200
    assert sorted(reads) == ["bad", "live", "live", "live", "ok"]


@pytest.mark.each_db
def test_a_sweeps_page_shows_its_tasks_parameters_causes_and_goodput(db, cfg, sched):
    from orchestrator.ops.sweep import SweepRequest, submit_sweep

    submit_sweep(db, cfg, SweepRequest(name="lr", command=["echo", "{x}"], params=[{"x": 1}, {"x": "<b>2</b>"}]))
    sched.ended.update({"lr.0000": 0, "lr.0001": 1})
    reconcile_pass(db, cfg, backend_for=lambda _n: sched)
    c = _client(cfg)
    r = c.get("/sweeps/lr")
    assert r.status_code == 200, r.text
    assert 'id="sweep-name">lr' in r.text and "sweep of 2" in r.text
    tasks = r.text[r.text.index('id="tasks"'):]
    assert tasks.index('href="/jobs/lr.0000"') < tasks.index('href="/jobs/lr.0001"')  # in task order
    assert '<code>{&#34;x&#34;: &#34;&lt;b&gt;2&lt;/b&gt;&#34;}</code>' in tasks  # a parameter is text
    assert 'class="cause c-crash"' in tasks and 'id="sweep-goodput">goodput' in r.text
    assert c.get("/sweeps/nope").status_code == 404
    assert 'href="/sweeps/lr"' in c.get("/").text  # a task's row links to its sweep


def test_the_timeline_draws_each_attempt_after_its_wait_with_its_held_split_and_cause():
    from orchestrator.dashboard.svg import timeline_svg

    g = {"attempts": [{"n": 1, "cause": "preempted", "seconds": {"startup": 5.0, "useful": 50.0, "lost_work": 10.0}},
                      {"n": 2, "cause": None, "seconds": {"startup": 5.0, "useful": 30.0}}],
         "waits": [{"seconds": 20.0, "cause": "queue"}, {"seconds": 0.0, "cause": "after preempted"}]}
    svg = timeline_svg(g)
    assert svg.count("<rect") == 6 and "attempt 1: preempted" in svg and "attempt 2: ok" in svg
    assert "<title>lost_work: 10.0 s</title>" in svg and "120 s</text>" in svg  # 20 + 65 + 35 on one axis
    assert timeline_svg({"attempts": [], "waits": []}) == "" and timeline_svg(None) == ""
    assert "&lt;x&gt;" in timeline_svg({"attempts": [{"n": 1, "cause": "<x>", "seconds": {"useful": 1.0}}]})


def test_the_fleet_page_draws_goodput_over_time_one_line_per_partition_its_names_escaped(db, cfg, sched):
    from orchestrator.core.jobqueries import get_job

    _fleet(db, cfg, sched)
    with db.write() as s:
        get_job(s, "ok").resources = {"extras": {"partition": "spot"}}
        get_job(s, "bad").resources = {"extras": {"partition": "<b>gpu</b>"}}  # a name with markup, shown as text
    r = _client(cfg).get("/fleet")
    chart = r.text[r.text.index('id="goodput-over-time"'):r.text.index('id="top-badput"')]
    assert 'aria-label="goodput over time"' in chart
    # the verified job held only useful time, the crashed one none: each its own line's point, titled
    assert "local/spot, " in chart and ": 100.0 % of" in chart
    assert "local/&lt;b&gt;gpu&lt;/b&gt;, " in chart and ": 0.0 % of" in chart and "<b>gpu" not in chart
    assert chart.count('<text x="86"') == 3  # a legend entry per partition (the live job's local/- too)


def test_the_fleet_page_with_nothing_held_says_so_instead_of_a_chart(db, cfg, sched):
    submit(db, cfg, SubmitRequest(name="queued", command=["true"], max_attempts=1))  # no pass has seen it start
    r = _client(cfg).get("/fleet")
    chart = r.text[r.text.index('id="goodput-over-time"'):r.text.index('id="top-badput"')]
    assert "nothing held in the last 7d" in chart and "<svg" not in chart


def test_the_fleet_page_reads_an_ended_jobs_heartbeats_once_and_a_live_ones_from_where_it_stopped(
        db, cfg, sched, monkeypatch):
    """The fleet page refreshes every 15 s over a week of jobs: a full read of every history on each refresh took
    15 s for 50 live jobs of 1 MiB (bench_live_refresh)."""
    from orchestrator.dashboard import queries
    from orchestrator.views import goodputview

    _fleet(db, cfg, sched)
    queries._ENDED_SPLITS.clear()
    full: list[str] = []
    real = goodputview.beats_of
    monkeypatch.setattr(goodputview, "beats_of", lambda run_dir, n: full.append(run_dir) or real(run_dir, n))
    c = _client(cfg)
    for _ in range(3):
        assert c.get("/fleet").status_code == 200
    assert sorted(p.rsplit("/", 1)[-1] for p in full) == ["bad", "ok"]  # the live job's: never a full read


def test_a_live_rows_step_shows_its_last_saved_step_and_how_long_it_has_run(db, cfg, sched):
    _fleet(db, cfg, sched)
    protocol.write_progress(cfg.runs_root / "live", 1, step=42, saved_step=40)
    r = _client(cfg).get("/")
    row = r.text[r.text.index('href="/jobs/live"'):].split("</tr>")[0]
    assert '<td class="num step">42 <span class="note">(40)</span></td>' in row
    running = row.split('<td class="num running">')[1].split("</td>")[0]
    assert running.endswith(" s") and float(running[:-2]) >= 0, running  # seen running by the pass: a duration
    ok = r.text[r.text.index('href="/jobs/ok"'):].split("</tr>")[0]
    assert '<td class="num running"></td>' in ok  # ended: nothing runs
