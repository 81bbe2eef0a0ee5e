"""A live job is never run twice because a cancel landed while its launch was still in
progress, or because the DB was lost and the name resubmitted; a `reconcile --watch` whose DB file
was deleted or replaced stops with a clear error instead of running on a DB nobody else sees."""

from __future__ import annotations

import os
import re
import signal
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
    wait_no_procs,
)
from orchkit import wait_for

from orchestrator import protocol

GATED = ("--outputs", "result/out.txt", "--", *job_argv("--result"))


@pytest.mark.parametrize("site", ["before_backend_submit", "after_backend_submit"])
def test_cancel_racing_a_slow_launch_leaves_no_process_running(orch, spawned, site):
    """A live job ran twice after `orch cancel` landed while the launch was still in progress.

    The launching orch pauses at that site (testhooks: ORCH_PAUSE_AT) until the test opens the gate:
    the cancel provably lands while the launch is in progress (``.reached`` says the pause began; the
    launcher is still alive when the cancel returns), with no fixed sleep (it paused 3 s).
    """
    run = orch.runs / "x"
    gate = run.parent.parent / f"gate-{site}"
    sampler = ProcessSampler(run)
    try:
        sub = orch_popen(orch, "submit", "--name", "x", *GATED,
                         env={"ORCH_PAUSE_AT": site, "ORCH_PAUSE_UNTIL": str(gate), "ORCH_PAUSE_S": "60"})
        spawned.append(sub)
        wait_for(Path(f"{gate}.reached").exists, 30, f"the launch to pause at {site}")
        assert "x" in status_map(orch)
        c = orch("cancel", "x")
        assert c.returncode == 0, (c.returncode, c.stdout, c.stderr)
        assert sub.poll() is None, "the launch ended before the cancel landed: the race was not exercised"
        gate.touch()
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
    """A live job ran twice after the DB file was deleted and the name resubmitted (two attempts in one run dir)."""
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
    """DB identity: a running `reconcile --watch` notices its DB file was replaced or deleted."""
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


@pytest.mark.parametrize("how", ["home_through_a_symlink", "home_with_dotdot", "program_cleared_its_env"])
def test_resubmitting_after_a_lost_db_is_refused_however_the_run_dir_is_spelled(orch, tmp_path, how):
    """Hostile test: the live check compared the literal ORCH_RUN_DIR string, so the same run dir spelled
    through a symlinked parent or `x/..`, or a program that cleared its environment, got a second attempt."""
    prog = ["sh", "-c", "exec env -i /bin/sleep 60" if how == "program_cleared_its_env" else "sleep 60"]
    p = orch("submit", "--name", "twin", "--", *prog)
    assert p.returncode == 0, p.stderr
    run = orch.runs / "twin"
    wait_for(lambda: live_job_procs(run) or _wrapper_alive(run), 30, "the first attempt running")
    for f in _db_files(orch.home):
        f.unlink(missing_ok=True)
    (tmp_path / "x").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path)
    home = {"home_through_a_symlink": tmp_path / "alias" / orch.home.name,
            "home_with_dotdot": tmp_path / "x" / ".." / orch.home.name}.get(how, orch.home)
    try:
        p = orch("submit", "--name", "twin", "--", *prog, env={"ORCH_HOME": str(home)})
        assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
        assert p.stderr.startswith("orch: refused: a live attempt runs in "), p.stderr
        assert not protocol.attempt_dir(run, 2).exists() and len(_wrappers(run)) == 1
    finally:
        for pid in _wrappers(run):
            os.killpg(pid, signal.SIGKILL)


def _wrappers(run: Path) -> list[int]:
    """Live job wrappers of ``run`` (by real path), each its session's leader."""
    from orchestrator.jobside import proctable

    return [p.pid for p in proctable.all_procs() if not p.zombie
            and os.path.realpath(proctable.wrapper_run_dir(p.pid) or "/nonexistent") == os.path.realpath(run)]


def _wrapper_alive(run: Path) -> bool:
    return bool(_wrappers(run))
