"""The kit's stop and completion records: written by the job, so read distrustfully; a recorded stop
classifies an attempt preempted (or timeout) whatever its exit code, whoever sent the signal."""

from __future__ import annotations

import json
import os
import signal

import pytest
from orchkit import wait_for

from orchestrator import protocol
from orchestrator.backends.base import Outcome, Phase
from orchestrator.decide.classify import classify
from orchestrator.kit.preemption import PreemptionFlag
from orchestrator.protocol import ExitRecord, FailureClass, FailureReport, MarkerStatus, StopRecord, Verification

ABSENT = Verification(MarkerStatus.ABSENT, "no done.json")
STOP = StopRecord(signal="TERM", at="2026-12-01T00:00:00", step=93)


@pytest.mark.parametrize("rc", [0, 1, 143])
def test_a_recorded_stop_is_preempted_whatever_the_exit(rc):
    c = classify(Outcome(Phase.EXITED, exit_code=rc), None, ABSENT, stop_record=STOP)
    assert (c.cls, c.step) == (FailureClass.PREEMPTED, 93) and "stop.json" in c.detail, c


def test_a_recorded_stop_at_the_time_limit_is_timeout():
    rec = ExitRecord(token="t", returncode=0, time_limit_reached=True)
    assert classify(Outcome(Phase.EXITED, exit_code=0), None, ABSENT, stop_record=STOP,
                    exit_record=rec).cls is FailureClass.TIMEOUT


def test_without_a_stop_record_exit_0_without_marker_stays_marker_missing():
    assert classify(Outcome(Phase.EXITED, exit_code=0), None, ABSENT).cls is FailureClass.MARKER_MISSING


def test_the_job_report_and_orchs_own_cancel_still_win_over_a_stop_record():
    out = Outcome(Phase.EXITED, exit_code=3)
    nan = FailureReport.parse({"class": "nan", "step": 4})
    assert classify(out, nan, ABSENT, stop_record=STOP).cls is FailureClass.NAN
    assert classify(out, None, ABSENT, stop_reason="cancel", stop_record=STOP).cls is FailureClass.CANCELLED


def test_read_stop_validates_and_takes_garbage_as_a_stop(tmp_path):
    protocol.write_stop(tmp_path, "TERM", "now", 5, "t1")
    assert protocol.read_stop(tmp_path, "t1") == StopRecord("TERM", "now", 5)
    assert protocol.read_stop(tmp_path, "other") is None  # another attempt's
    (tmp_path / protocol.STOP_FILE).write_text(json.dumps({"signal": "TERM\nX", "step": 10**30}))
    assert protocol.read_stop(tmp_path) == StopRecord("unknown", "", None)
    (tmp_path / protocol.STOP_FILE).write_text("{not json")
    assert protocol.read_stop(tmp_path).signal == "unknown"  # present but unreadable: still a stop
    (tmp_path / protocol.STOP_FILE).unlink()
    assert protocol.read_stop(tmp_path) is None


def test_read_completion_drops_outputs_that_leave_the_run_dir(tmp_path):
    adir = protocol.attempt_dir(tmp_path, 1)
    protocol.write_completion(tmp_path, 1, "t1", 7, ["out/*", "../x", "/etc/passwd", "a/../../b", "models/"])
    rec = protocol.read_completion(adir, "t1")
    assert rec.outputs == ("result/", "out/*", "models/") and rec.step == 7
    assert rec.patterns() == ["result/**", "out/*", "models/**"]
    assert protocol.read_completion(adir, "t2") is None


def test_the_signal_handler_only_wakes_a_writer_that_records_the_stop_promptly(tmp_path):
    flag = PreemptionFlag(attempt_dir=tmp_path).install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        # Written by the writer thread, no step boundary reached.
        wait_for((tmp_path / protocol.STOP_FILE).exists, 10, "stop.json", interval=0.01)
        assert protocol.read_stop(tmp_path).step is None
        flag.record_step(12)  # at the step boundary
        assert protocol.read_stop(tmp_path).step == 12
    finally:
        flag.uninstall()


def test_uninstall_leaves_a_handler_a_framework_put_back_meanwhile(tmp_path):
    # HF's enable_jit_checkpoint restores the handler it found at train end; ours must not then put JIT's back.
    before = signal.getsignal(signal.SIGUSR2)
    flag = PreemptionFlag(attempt_dir=tmp_path).install((signal.SIGUSR2,))
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # the framework's restore
    flag.uninstall()
    try:
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR2, before)
