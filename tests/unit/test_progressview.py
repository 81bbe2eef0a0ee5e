"""The arithmetic and text behind `orch watch`: ETA from the job's own heartbeat clock, and the plain
line scripts parse (its part up to the closing parenthesis must not change)."""

from __future__ import annotations

import io

import pytest

from orchestrator.cli.live import PlainView, bar_stats, make_view
from orchestrator.views.progressview import JobProgress, RateMeter, clock, human, state_line, stats_text


def snap(**kw) -> JobProgress:
    base = {"name": "j", "state": "running", "attempt": 1, "attempt_state": "running", "restarts": 0,
            "settled": False}
    return JobProgress(**{**base, **kw})


def test_eta_follows_the_heartbeat_clock_not_the_polling():
    m = RateMeter()
    assert m.eta_s(snap(step=10, max_steps=110, beat_time=100.0)) is None  # one heartbeat: no rate yet
    assert m.eta_s(snap(step=10, max_steps=110, beat_time=100.0)) is None  # the same one polled again
    assert m.eta_s(snap(step=20, max_steps=110, beat_time=105.0)) == pytest.approx(45.0)  # 2 steps/s


def test_eta_starts_over_on_a_new_attempt_or_a_step_that_went_back():
    m = RateMeter()
    m.eta_s(snap(step=10, max_steps=100, beat_time=0.0))
    m.eta_s(snap(step=50, max_steps=100, beat_time=10.0))
    # Attempt 2 resumed at step 40: the old samples would give a negative or absurd rate.
    assert m.eta_s(snap(attempt=2, step=40, max_steps=100, beat_time=500.0)) is None
    assert m.eta_s(snap(attempt=2, step=41, max_steps=100, beat_time=501.0)) == pytest.approx(59.0)
    assert m.eta_s(snap(attempt=2, step=30, max_steps=100, beat_time=502.0)) is None  # in-place restart


def test_eta_falls_back_to_tokens_per_second_over_tokens_per_step():
    m = RateMeter()
    s = snap(step=0, max_steps=100, beat_time=1.0, tokens_per_s=1024.0, tokens_per_step=512)
    assert m.eta_s(s) == pytest.approx(50.0)
    assert m.eta_s(snap(step=5, max_steps=None, beat_time=2.0)) is None  # no max: no ETA


def test_old_samples_leave_the_window():
    m = RateMeter(window_s=10.0)
    m.eta_s(snap(step=0, max_steps=1000, beat_time=0.0))
    m.eta_s(snap(step=100, max_steps=1000, beat_time=5.0))  # fast at first: 20 steps/s
    m.eta_s(snap(step=101, max_steps=1000, beat_time=15.0))
    eta = m.eta_s(snap(step=102, max_steps=1000, beat_time=25.0))  # now 0.1 steps/s
    assert eta == pytest.approx(898 / 0.1)


def test_the_state_line_keeps_its_shape_and_facts_follow_it():
    s = snap(step=7, max_steps=20, loss=0.5714, tokens_per_s=2048.0, eta_s=65.0, restarts=2)
    assert state_line(s) == "j: running (attempt 1, step 7)"
    assert state_line(snap(state="submitted", attempt=2)) == "j: submitted (attempt 2)"
    assert stats_text(s) == "max 20  loss 0.5714  2.0k tok/s  ETA 0:01:05  restarts 2"
    assert bar_stats(s) == "7/20 · loss 0.5714 · 2.0k tok/s · ETA 0:01:05 · attempt 1 · restarts 2"
    assert stats_text(snap(settled=True, eta_s=3.0, state="done_marker_verified")) == ""  # no ETA once over


def test_numbers_for_people():
    assert [human(x) for x in (12, 1234, 2.5e6, 3e9)] == ["12", "1.2k", "2.5M", "3.0G"]
    assert [clock(x) for x in (0, 65, 3661, 99 * 3600, 200 * 3600)] == ["0:00:00", "0:01:05", "1:01:01",
                                                                         "99:00:00", "8d"]


def test_plain_view_prints_state_changes_at_once_and_progress_at_most_every_interval():
    out = io.StringIO()
    v = PlainView(out, every_s=3600)
    v.update(snap(step=1))
    v.update(snap(step=2))  # progress only, within the interval: no line
    v.update(snap(step=3, restarts=1))  # the scheduler requeued it: at once
    v.update(snap(step=3, restarts=1, state="done_marker_verified", settled=True))
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines == ["j: running (attempt 1, step 1)", "j: running (attempt 1, step 3)  restarts 1",
                     "j: done_marker_verified (attempt 1, step 3)  restarts 1"]


def test_a_pipe_or_a_dumb_terminal_gets_plain_lines(monkeypatch):
    assert isinstance(make_view(io.StringIO()), PlainView)

    class FakeTty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("TERM", "dumb")
    assert isinstance(make_view(FakeTty()), PlainView)
    monkeypatch.setenv("TERM", "xterm")
    assert isinstance(make_view(FakeTty(), plain=True), PlainView)
