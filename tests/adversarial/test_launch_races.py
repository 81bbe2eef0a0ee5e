"""Issue 9: a live job is never run twice because a cancel landed while its launch was still in
progress, or because the DB was lost and the name resubmitted; a `reconcile --watch` whose DB file
was deleted or replaced stops with a clear error instead of running on a DB nobody else sees."""

from __future__ import annotations

import re
import subprocess
import threading
from pathlib import Path

import pytest
from advkit import (
    ProcessSampler,
    assert_no_stuck,
    job_argv,
    live_job_procs,
    one_line_error,
    orch_popen,
    reconcile_ok,
    settle,
    show,
    status_map,
    wait_for,
    wait_no_procs,
)

from orchestrator import protocol

GATED = ("--outputs", "result/out.txt", "--", *job_argv("--result"))


@pytest.mark.parametrize("site", ["before_backend_submit", "after_backend_submit"])
def test_cancel_racing_a_slow_launch_leaves_no_process_running(orch, spawned, site):
    """Issue 9: 'after `orch cancel` lands while the launch is still in progress'.

    ORCH_PAUSE_AT/ORCH_PAUSE_S is a test hook the fix adds (the launching orch sleeps at that site);
    without it the launch is fast and this test may pass without exercising the race.
    """
    run = orch.runs / "x"
    sampler = ProcessSampler(run)
    try:
        sub = orch_popen(orch, "submit", "--name", "x", *GATED, env={"ORCH_PAUSE_AT": site, "ORCH_PAUSE_S": "3"})
        spawned.append(sub)
        wait_for(lambda: "x" in status_map(orch), 30, "job x to be listed")
        c = orch("cancel", "x")
        assert c.returncode == 0, (c.returncode, c.stdout, c.stderr)
        _out, err = sub.communicate(timeout=60)
        assert "Traceback" not in err, err
        # The launcher either did not start the job, or stopped what it started.
        wait_no_procs(run, 40, "after a cancel that raced the launch")
        settle(orch, ["x"])
        sampler.stop()
        sampler.assert_never_two_attempts()
        d = show(orch, "x")
        assert d["state"] == "cancelled", d
        assert [a["n"] for a in d["attempts"]] == [1], d["attempts"]  # reconcile never creates attempt 2
        assert_no_stuck(orch)
        assert not live_job_procs(run)
    finally:
        sampler.stop()


def _db_files(home: Path) -> list[Path]:
    return [home / "orch.db", home / "orch.db-wal", home / "orch.db-shm"]


def test_resubmitting_a_name_whose_db_was_deleted_is_refused_while_it_runs(orch):
    """Issue 9: 'after the DB file is deleted and the name resubmitted' (two attempts in one run dir)."""
    run = orch.runs / "j"
    sampler = ProcessSampler(run)
    try:
        p = orch("submit", "--name", "j", *GATED)
        assert p.returncode == 0, p.stderr
        wait_for((run / "started").exists, 30, "the job to start")
        reconcile_ok(orch)
        for f in _db_files(orch.home):
            f.unlink(missing_ok=True)

        p = orch("submit", "--name", "j", *GATED)
        sampler.assert_never_two_attempts()
        assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
        assert re.search(r"live|running", p.stderr, re.I), p.stderr
        assert "Traceback" not in p.stderr
        assert len(live_job_procs(run)) >= 1, "the first run must be left alone"
        assert (protocol.attempt_dir(run, 1) / "stdout.log").exists(), "the live attempt's dir was moved away"

        (run / "go").touch()
        wait_no_procs(run, 40, "after go")
        sampler.stop()
        sampler.assert_never_two_attempts()
        assert (run / "ran.log").read_text().count("attempt=") == 1, (run / "ran.log").read_text()
        assert (run / "result" / "out.txt").read_text() == "ok j\n"
        settle(orch)
        assert_no_stuck(orch)
    finally:
        sampler.stop()


@pytest.mark.parametrize("how", ["deleted", "replaced_by_an_empty_file"])
def test_reconcile_watch_exits_when_its_db_file_is_deleted_or_replaced(orch, spawned, how):
    """Issue 9, 'DB identity': a running `reconcile --watch` notices its DB file was replaced or deleted."""
    w = orch_popen(orch, "reconcile", "--watch", "1", "--json")
    spawned.append(w)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(w.stdout.readline, "")), daemon=True)
    reader.start()
    wait_for(lambda: "}\n" in lines or w.poll() is not None, 30, "the first --watch pass")
    assert w.poll() is None, f"--watch exited before its DB was touched: {w.stderr.read()}"
    for f in _db_files(orch.home):
        f.unlink(missing_ok=True)
    if how == "replaced_by_an_empty_file":
        (orch.home / "orch.db").touch(mode=0o600)
    try:
        rc = w.wait(timeout=15)
    except subprocess.TimeoutExpired:
        rc = None
    if rc is None:
        w.kill()
        w.wait(timeout=10)
        pytest.fail(f"reconcile --watch kept running for 15 s after its DB file was {how.replace('_', ' ')}")
    err = w.stderr.read()
    assert rc == 1, (rc, err)
    one_line_error(err)
    assert "database" in err.lower(), err
