"""orchestrator.filelock: an exclusive lock orch owns is bounded and names its holder (the end-to-end cases, a
stopped sweep holding the launch lock, are in tests/adversarial/test_bounded_waits.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from orchkit import wait_for

from orchestrator import filelock
from orchestrator.errors import OrchError


class _Busy(OrchError):
    pass


HOLD = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600); "
        "fcntl.flock(fd, fcntl.LOCK_EX); open(sys.argv[1] + '.held', 'w').close(); time.sleep(120)")


def test_a_free_lock_is_taken_and_released(tmp_path):
    path = tmp_path / "x.lock"
    with filelock.exclusive(path, _Busy, timeout_s=1):
        pass
    with filelock.exclusive(path, _Busy, timeout_s=1):  # released: taken again at once
        pass


@pytest.mark.timeout(60)  # proves a bound: without it the lock waits for ever, and this fails here
def test_a_held_lock_gives_up_at_its_bound_with_the_callers_error_naming_the_holder(tmp_path):
    path = tmp_path / "x.lock"
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path)])
    try:
        wait_for(lambda: (tmp_path / "x.lock.held").exists(), 30, "the holder took the lock")
        with pytest.raises(_Busy) as e, filelock.exclusive(path, _Busy, what="the test lock ", timeout_s=0.3):
            pass
        assert isinstance(e.value, filelock.LockTimeout)
        msg = str(e.value)
        assert f"pid {p.pid}" in msg and "stopped" not in msg and msg.endswith("gave up after 0.3 s"), msg
    finally:
        p.kill()
        p.wait()
    with filelock.exclusive(path, _Busy, timeout_s=1):  # the holder died: the kernel released its flock
        pass


@pytest.mark.timeout(60)  # proves the rule: waiting out the 600 s bound fails here
def test_a_stopped_holder_is_not_waited_for_and_is_named_with_how_to_resume_it(tmp_path):
    """A Ctrl-Z'd command cannot let go by itself; waiting the bound out cost every other command
    in the home its whole wait (300 s for the migrate lock), though the message already said "stopped"."""
    path = tmp_path / "x.lock"
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path)])
    try:
        wait_for(lambda: (tmp_path / "x.lock.held").exists(), 30, "the holder took the lock")
        os.kill(p.pid, signal.SIGSTOP)
        with pytest.raises(_Busy) as e, filelock.exclusive(path, _Busy, what="the test lock ", timeout_s=600):
            pass
        msg = str(e.value)
        assert f"pid {p.pid} (" in msg and ", stopped)" in msg, msg
        assert msg.endswith(f"not waited for: a stopped holder cannot let go (resume it with kill -CONT {p.pid}, "
                            "or end it)"), msg
        os.kill(p.pid, signal.SIGCONT)  # resumed, it is a live holder again: waited for, up to the bound
        with pytest.raises(_Busy) as e, filelock.exclusive(path, _Busy, timeout_s=0.3):
            pass
        assert str(e.value).endswith("gave up after 0.3 s"), str(e.value)
    finally:
        p.kill()
        p.wait()


@pytest.mark.timeout(60)  # the migrate lock's own 300 s default would fail here
def test_the_migrate_lock_honours_orch_lock_timeout_s(tmp_path, monkeypatch):
    """ORCH_LOCK_TIMEOUT_S did not shorten the migrate lock's 300 s wait (a live upgrader holding it)."""
    from orchestrator.core.config import load_config
    from orchestrator.core.db import Database
    from orchestrator.errors import DatabaseProblem

    monkeypatch.delenv("ORCH_DB_URL", raising=False)
    monkeypatch.setenv("ORCH_LOCK_TIMEOUT_S", "0.5")
    cfg = load_config(tmp_path / "home")
    cfg.home.mkdir(mode=0o700)
    lock = cfg.home / "orch.migrate.lock"
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)])
    try:
        wait_for(lambda: (cfg.home / "orch.migrate.lock.held").exists(), 30, "the holder took the migrate lock")
        with pytest.raises(DatabaseProblem) as e:
            Database(cfg)  # a new DB: its first command upgrades it, under the migrate lock
        assert f"the migrate lock {lock} is held by pid {p.pid}" in str(e.value), str(e.value)
        assert str(e.value).endswith("gave up after 0.5 s"), str(e.value)
    finally:
        p.kill()
        p.wait()


def test_the_bound_comes_from_orch_lock_timeout_s(monkeypatch):
    monkeypatch.setenv("ORCH_LOCK_TIMEOUT_S", "2.5")
    assert filelock.lock_timeout_s() == 2.5
    monkeypatch.setenv("ORCH_LOCK_TIMEOUT_S", "soon")
    assert filelock.lock_timeout_s(7.0) == 7.0
