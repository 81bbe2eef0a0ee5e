"""kit.trackers.StopTolerance: a tracker call that fails during a stop is noted and skipped; outside a stop it
raises as before. End to end, with W&B's service process signalled as Slurm does:
tests/integrations/test_tracker_curves.py (each integration preempted twice, the first time with W&B's service
signalled too, then killed)."""

from __future__ import annotations

import pytest

from orchestrator.kit.trackers import StopTolerance


class Logger:
    def __init__(self) -> None:
        self.calls = 0

    def log_metrics(self, value: int) -> int:
        self.calls += 1
        if value < 0:
            raise ConnectionResetError("Connection lost")
        return value


def test_a_failure_outside_a_stop_is_raised_and_one_during_a_stop_is_noted_and_skipped():
    stopping = False
    tol = StopTolerance(lambda: stopping)
    lg = Logger()
    tol.wrap_methods(lg, ("log_metrics", "absent"))
    assert lg.log_metrics(3) == 3
    with pytest.raises(ConnectionResetError):
        lg.log_metrics(-1)
    assert tol.report() == "" and tol.count == 0
    stopping = True
    assert lg.log_metrics(-1) is None
    assert lg.log_metrics(4) == 4  # a call that works still returns its value
    assert tol.report() == "; ignored during the stop: Logger.log_metrics: ConnectionResetError: Connection lost"
    assert lg.calls == 4


def test_the_report_names_five_failures_and_counts_the_rest_and_a_second_wrap_adds_no_layer():
    tol = StopTolerance(lambda: True)
    lg = Logger()
    tol.wrap_methods(lg, ("log_metrics",))
    once = lg.log_metrics
    tol.wrap_methods(lg, ("log_metrics",))
    assert lg.log_metrics is once
    for _ in range(7):
        lg.log_metrics(-1)
    assert tol.count == 7 and tol.report().endswith("Connection lost (+2 more)"), tol.report()
    assert "log_metrics" not in vars(Logger()), "the class itself is left as it was"


def test_an_interrupt_is_never_swallowed():
    tol = StopTolerance(lambda: True)

    def ctrl_c() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tol.wrap(ctrl_c, "ctrl_c")()
