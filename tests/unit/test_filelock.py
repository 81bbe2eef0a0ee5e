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
        os.kill(p.pid, signal.SIGSTOP)  # a Ctrl-Z'd command: it will never let go by itself
        with pytest.raises(_Busy) as e, filelock.exclusive(path, _Busy, what="the test lock ", timeout_s=0.3):
            pass
        assert isinstance(e.value, filelock.LockTimeout)
        msg = str(e.value)
        assert f"pid {p.pid}" in msg and "stopped" in msg and "gave up after 0.3 s" in msg, msg
    finally:
        p.kill()
        p.wait()
    with filelock.exclusive(path, _Busy, timeout_s=1):  # the holder died: the kernel released its flock
        pass


def test_the_bound_comes_from_orch_lock_timeout_s(monkeypatch):
    monkeypatch.setenv("ORCH_LOCK_TIMEOUT_S", "2.5")
    assert filelock.lock_timeout_s() == 2.5
    monkeypatch.setenv("ORCH_LOCK_TIMEOUT_S", "soon")
    assert filelock.lock_timeout_s(7.0) == 7.0
