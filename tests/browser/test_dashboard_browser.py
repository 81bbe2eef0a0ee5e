"""``orch dashboard`` as a person uses it: the real server (``orch dashboard``, a subprocess) over a fleet built
from real runs, driven in headless Chromium (Debian's, through Playwright). The fleet: a bundled-trainer job
sent a real SIGTERM and then a NaN (preempted, rolled back, verified), a 2-rank job, a sweep with a failed task,
and a job whose stderr holds a ``<script>``. Screenshots go to ``screenshots/`` (ignored by git)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from orchkit import PY, ROOT, Orch, orch_for

TRAINER = [sys.executable, "-m", "orch_trainer", "--preset", "tiny", "--max-steps", "60", "--save-interval", "5",
           "--heartbeat-interval", "0.02", "--inject-fault", "sigterm@step=12", "--inject-fault", "nan@step=25"]
XSS = "<script>document.title='pwned'</script>"
# Where the screenshots go: screenshots/ (ignored) on every run; the docs' pictures are this run's, written with
# ORCH_SCREENSHOTS_DIR=docs/images (docs/guides/dashboard.md says how).
SHOTS = Path(os.environ.get("ORCH_SCREENSHOTS_DIR") or ROOT / "screenshots")


def chromium() -> str:
    """Debian's chromium (deploy/browser/chromium.sh installs it as root); under CI its absence fails."""
    p = subprocess.run(["bash", str(ROOT / "deploy" / "browser" / "chromium.sh")], capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no chromium (CI=true: the browser tests must run): {p.stderr.strip()}", pytrace=False)
        pytest.skip(f"no chromium: {p.stderr.strip()}; CI is not set")
    return p.stdout.strip()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Orch:
    o = orch_for(tmp_path_factory.mktemp("fleet") / "orch-home")
    o("submit", "--name", "curve", "--", *TRAINER, check=True)
    o("submit", "--name", "ddp", "--nproc-per-node", "2", "--", PY, str(ROOT / "examples" / "plain_loop.py"),
      "--max-steps", "30", check=True)
    o("sweep", "--name", "sw", "--grid", "steps=10,ten", "--max-attempts", "1", "--", PY,  # "ten": argparse fails
      str(ROOT / "examples" / "plain_loop.py"), "--max-steps", "{steps}", check=True)
    o("submit", "--name", "xss", "--max-attempts", "1", "--", PY, "-c",
      f"import sys; print({XSS!r}, file=sys.stderr); sys.exit(3)", check=True)
    for name, want in (("curve", "done_marker_verified"), ("ddp", "done_marker_verified"),
                       ("sw.0000", "done_marker_verified"), ("sw.0001", "failed"), ("xss", "failed")):
        assert o.wait(name, {"done_marker_verified", "failed"}, timeout=300) == want, o.show(name)
    return o


@contextlib.contextmanager
def _serve(o: Orch, *args: str) -> Iterator[str]:
    """``orch dashboard ARGS --port 0`` running; yields the URL it printed."""
    p = subprocess.Popen([PY, "-m", "orchestrator.cli", "dashboard", *args, "--port", "0"], env=o.env,
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=str(ROOT))
    try:
        line = p.stderr.readline()
        assert line.startswith("orch dashboard: http://"), line + (p.stderr.read() if p.poll() is not None else "")
        yield line.split()[2]
    finally:
        p.terminate()
        p.wait(timeout=30)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    path = chromium()
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=path)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    pg.console_errors = []
    # the favicon a browser asks for after a refused page (401 too) is the browser's, not a page's resource
    pg.on("console", lambda m: pg.console_errors.append(m.text)
          if m.type == "error" and not (m.location.get("url") or "").endswith("/favicon.ico") else None)
    yield pg
    ctx.close()


def _shot(pg, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SHOTS / f"dashboard-{name}.png"), full_page=True)


def test_a_user_sees_the_fleet_filters_it_and_opens_a_job_with_its_attempts_causes_and_curve(fleet, page):
    with _serve(fleet) as url:
        _the_fleet_as_a_user_sees_it(page, url)


def _the_fleet_as_a_user_sees_it(page, url: str) -> None:
    base = url.split("?token=")[0]
    assert page.goto(base).status == 401  # on 127.0.0.1 too: a login node's other users reach its loopback
    page.console_errors.clear()  # that refusal's own (the page, and the favicon the browser asks for)
    page.goto(url)
    names = page.locator("#jobs tbody tr td:first-child a").all_inner_texts()
    assert set(names) == {"curve", "ddp", "sw.0000", "sw.0001", "xss"}, names
    assert page.locator("#state-chips a", has_text="failed 2").count() == 1
    _shot(page, "jobs")

    page.locator("#state-chips a", has_text="failed 2").click()  # filter by state: the URL keeps it
    page.wait_for_url("**/?state=failed")
    assert sorted(page.locator("#jobs tbody tr td:first-child a").all_inner_texts()) == ["sw.0001", "xss"]

    page.goto(base)  # the cookie the printed URL set
    page.locator("#jobs a", has_text="curve").click()
    page.wait_for_url("**/jobs/curve")
    assert page.locator("#job-state").inner_text() == "done_marker_verified"
    causes = page.locator("#attempts tbody tr td:nth-child(3) .cause").all_inner_texts()
    assert causes == ["preempted", "nan", "ok"], causes
    assert page.locator("#curve svg polyline").count() >= 3  # one series per attempt
    marks = page.locator("#curve figcaption .mark").all_inner_texts()
    assert any(m.startswith("preemption at step 11") for m in marks) and any(m.startswith("rollback") for m in marks)
    assert page.locator("#checkpoints tbody tr").count() >= 1
    assert page.locator("#timeline svg text", has_text="attempt 1: preempted").count() == 1  # the Gantt of attempts
    assert page.locator("#timeline svg rect.tl-useful").count() >= 2
    _shot(page, "job")

    page.goto(base + "jobs/ddp")
    assert page.locator("#attempts tbody tr td:nth-child(8)").inner_text() == "2"  # the world size

    page.locator("header nav a", has_text="fleet").click()  # the fleet: orch report's view and the suspect nodes
    page.wait_for_url("**/fleet")
    assert page.locator("#fleet-summary").inner_text().startswith("5 jobs: goodput ")
    assert page.locator("#by-partition tbody tr td:first-child").all_inner_texts() == ["local/-"]
    assert page.locator("#by-sweep tbody a").all_inner_texts() == ["sw"]
    chart = page.locator("#goodput-over-time svg")  # goodput over time: local/-'s line, its legend
    assert chart.is_visible() and chart.locator("circle").count() >= 1
    assert "local/-" in chart.locator("text").all_text_contents()
    badput = page.locator("#top-badput tbody .cause").all_inner_texts()
    assert any("preempted" in c or "nan" in c for c in badput), badput  # the curve job's restarts cost held time
    _shot(page, "fleet")
    assert page.console_errors == [], page.console_errors  # no CSP violation, no missing resource


def test_a_job_written_script_is_shown_as_text_never_run(fleet, page):
    with _serve(fleet) as url:
        page.goto(url)
        page.goto(url.split("?token=")[0] + "jobs/xss")
        assert page.title() == "xss · orch"  # the script never ran: it would have set the title
        assert XSS in page.locator("pre.log").all_inner_texts()[-1]
        assert page.console_errors == []


def _outward_address() -> str | None:
    """An address of this machine that is not loopback (the one its default route leaves by), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


def test_from_another_host_the_dashboard_needs_its_token_and_the_printed_url_opens_it(fleet, page, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("a-token-of-the-users-own-0123456789\n")
    with _serve(fleet, "--host", "0.0.0.0", "--token-file", str(token_file)) as url:
        assert url.endswith("?token=a-token-of-the-users-own-0123456789")
        _the_token_opens_it(page, url)


def _the_token_opens_it(page, url: str) -> None:
    base, token = url.split("?token=")
    port = base.rstrip("/").rsplit(":", 1)[1]
    addr = _outward_address() or "127.0.0.1"  # the token is required of every client, loopback too
    r = page.goto(f"http://{addr}:{port}/")
    assert r.status == 401 and "needs its token" in page.content() and token not in page.content()
    r = page.goto(f"http://{addr}:{port}/?token={token}")
    assert r.status == 200 and page.url == f"http://{addr}:{port}/"  # the token left the address bar
    assert page.locator("#jobs tbody tr").count() == 5
    page.goto(f"http://{addr}:{port}/jobs/curve")  # the cookie opens the next page
    assert page.locator("#job-state").inner_text() == "done_marker_verified"
    assert shutil.which("curl") is None or subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"http://{addr}:{port}/jobs/curve"],
        capture_output=True, text=True, timeout=30).stdout == "401"  # a client without it, elsewhere
