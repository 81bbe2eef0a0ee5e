"""stoppedwatch.StoppedWatch: the wrapper's record of its program stopped (SIGSTOP, Ctrl-Z), there while it is,
gone when it runs again or ends. Judged in staleness (tests/unit/test_rank_heartbeat.py), end to end in
tests/local/test_stopped_program.py."""

from __future__ import annotations

import signal
import subprocess

from orchkit import wait_for

from orchestrator import protocol
from orchestrator.jobside.stoppedwatch import StoppedWatch, interval_from_env


def test_the_record_exists_exactly_while_the_program_is_stopped(tmp_path):
    p = subprocess.Popen(["sleep", "60"])
    w = StoppedWatch(p.pid, tmp_path, interval=3600)  # looked at by hand below
    record = tmp_path / protocol.PROGRAM_STOPPED
    try:
        w.look()
        assert not record.exists()
        p.send_signal(signal.SIGSTOP)
        wait_for(lambda: w.look() or record.exists(), 30, "the record of the stopped program", interval=0.01)
        p.send_signal(signal.SIGCONT)
        wait_for(lambda: w.look() or not record.exists(), 30, "the record gone, the program running again",
                 interval=0.01)
        p.send_signal(signal.SIGSTOP)
        wait_for(lambda: w.look() or record.exists(), 30, "the record of the stopped program", interval=0.01)
        w.stop()
        assert not record.exists(), "the record goes with the program"
    finally:
        p.kill()
        p.wait()


def test_the_interval_is_the_heartbeats_bounded():
    assert interval_from_env({}) == 2.0
    assert interval_from_env({"ORCH_HEARTBEAT_S": "0"}) == 0.05
    assert interval_from_env({"ORCH_HEARTBEAT_S": "inf"}) == 60.0
    assert interval_from_env({"ORCH_HEARTBEAT_S": "x"}) == 2.0
