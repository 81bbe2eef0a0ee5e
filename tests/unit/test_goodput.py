"""Goodput accounting (orchestrator/core/goodput.py): hand-computed splits of scripted attempt histories.

Each case is a timeline written out in seconds; the expected numbers are worked by hand in the comments.
"""

from __future__ import annotations

import random

import pytest

from orchestrator.core.goodput import (
    HELD,
    AttemptFacts,
    Beat,
    Category,
    split_attempt,
    split_job,
    summarize,
)

C = Category


def held_sum(split) -> float:
    return sum(split.seconds[c.value] for c in HELD)


def preempted_then_resumed() -> list[AttemptFacts]:
    # attempt 1: held 0 -> 40. Loop starts at 10 (beat at step 0), save of step 20 blocks 2 s (stall 2 by
    # t=32), the SIGTERM save of step 25 blocks 2 s more (last beat t=37, stall 4). Preempted.
    a1 = AttemptFacts(1, 0.0, 40.0, "preempted", beats=(
        Beat(10, 0, 0, 0.0), Beat(20, 10, 0, 0.0), Beat(32, 20, 0, 2.0, saved_step=20), Beat(35, 25, 0, 2.0),
        Beat(37, 25, 0, 4.0, saved_step=25)), gpus=4)
    # attempt 2: held 50 -> 66, resumes from step 20 (as if the step-25 save were lost), loop at 55, step 30 at 65.
    a2 = AttemptFacts(2, 50.0, 66.0, None, beats=(Beat(55, 20, 20, 0.0), Beat(65, 30, 20, 0.0)), gpus=4)
    return [a1, a2]


def test_a_preemption_splits_into_startup_useful_lost_stall_teardown_and_waiting():
    job = split_job("j", preempted_then_resumed(), created=-5.0, now=1000.0)
    a1, a2 = job.attempts
    # attempt 1: training 37 - 10 - stall 4 = 23 s for 25 steps -> 0.92 s/step; 20 kept, 5 redone
    assert a1.step_time_s == pytest.approx(0.92)
    assert (a1.steps_kept, a1.steps_redone) == (20, 5)
    assert a1.seconds[C.STARTUP] == pytest.approx(10)
    assert a1.seconds[C.USEFUL] == pytest.approx(18.4)
    assert a1.seconds[C.LOST_WORK] == pytest.approx(4.6)
    assert a1.seconds[C.SAVE_STALL] == pytest.approx(4)
    assert a1.seconds[C.TEARDOWN] == pytest.approx(3)
    assert held_sum(a1) == pytest.approx(a1.held_s) == pytest.approx(40)
    # attempt 2: startup 5, 10 steps in 10 s all kept (it succeeded), 1 s to exit
    assert (a2.seconds[C.STARTUP], a2.seconds[C.USEFUL], a2.seconds[C.TEARDOWN]) == pytest.approx((5, 10, 1))
    # waiting: 5 s in the queue before attempt 1, 10 s between the preemption and attempt 2 (not held)
    assert job.waiting == [(5.0, "queue"), (10.0, "preempted")]
    total = job.seconds
    assert total[C.WAITING] == 15
    assert job.held_s == 56
    assert job.gpu_seconds()[C.USEFUL] == pytest.approx(4 * 28.4)


def test_hang_detection_runs_from_the_last_beat_to_orchs_stop_request():
    a = AttemptFacts(1, 0.0, 45.0, "hang", stop_reason="hang", stop_requested=41.0,
                     beats=(Beat(1, 0, 0, 0.0), Beat(11, 10, 0, 0.0)))
    s = split_attempt(a, kept_until=None, now=100.0)
    assert s.seconds[C.HANG_DETECTION] == pytest.approx(30)
    assert s.seconds[C.TEARDOWN] == pytest.approx(4)
    assert s.seconds[C.STARTUP] == pytest.approx(1)
    assert held_sum(s) == pytest.approx(45)


def test_hang_detection_runs_from_the_stale_ranks_last_beat_not_rank_0s():
    """Rank 1 stopped beating at t=5 while rank 0 beat on to t=11 (the history is rank 0's): the
    detector's delay is the stale rank's age when orch stopped it (stale_age_s, recorded with the stop), so the
    hang began at 41 - 36 = 5. Rank 0's last beat put the start at 11: 6 s of hang counted as training."""
    a = AttemptFacts(1, 0.0, 45.0, "hang", stop_reason="hang", stop_requested=41.0, stale_age_s=36.0,
                     beats=(Beat(1, 0, 0, 0.0), Beat(5, 4, 0, 0.0), Beat(11, 10, 0, 0.0)))
    s = split_attempt(a, kept_until=None, now=100.0)
    assert s.seconds[C.HANG_DETECTION] == pytest.approx(36)
    assert (s.seconds[C.TEARDOWN], s.seconds[C.STARTUP], s.steps_computed) == (pytest.approx(4), pytest.approx(1), 4)
    assert held_sum(s) == pytest.approx(45)
    # a rank that never beat: its age runs from rank 0's first beat; no step computed, the attempt's time failed
    never = AttemptFacts(1, 0.0, 45.0, "hang", stop_reason="hang", stop_requested=41.0, stale_age_s=40.0,
                         beats=(Beat(1.0004, 0, 0, 0.0), Beat(20, 0, 0, 0.0)))
    s = split_attempt(never, kept_until=None, now=100.0)
    assert s.seconds[C.FAILED_ATTEMPT] == pytest.approx(45) and not s.assumptions, s.assumptions


def test_an_attempt_that_never_computed_a_step_is_time_in_a_failed_attempt_once_ended_startup_while_running():
    crashed = split_attempt(AttemptFacts(1, 0.0, 7.0, "crash"), None, now=100.0)
    assert crashed.seconds[C.FAILED_ATTEMPT] == 7 and held_sum(crashed) == 7
    restoring = split_attempt(AttemptFacts(1, 0.0, None, None, beats=(Beat(3, 40, 40, 0.0),)), None, now=9.0)
    assert restoring.seconds[C.STARTUP] == 9 and restoring.seconds[C.FAILED_ATTEMPT] == 0


def test_a_failed_last_attempt_keeps_only_up_to_its_last_save():
    # killed at step 30 after a save of step 20: no next attempt yet, the next one resumes from 20
    a = AttemptFacts(1, 0.0, 32.0, "killed", beats=(Beat(0, 0, 0, 0.0), Beat(20, 20, 0, 0.0, saved_step=20),
                                                     Beat(30, 30, 0, 0.0)))
    s = split_attempt(a, None, now=100.0)
    assert (s.steps_kept, s.steps_redone) == (20, 10)
    assert s.seconds[C.LOST_WORK] == pytest.approx(10)


def test_no_beat_at_the_start_step_extrapolates_the_loop_start_from_the_step_rate():
    # resumed from 100, first beat at step 110 (t=30), then step 120 (t=40): 1 s/step, so the loop began at 20
    a = AttemptFacts(3, 0.0, 41.0, None, beats=(Beat(30, 110, 100), Beat(40, 120, 100)))
    s = split_attempt(a, None, now=100.0)
    assert s.seconds[C.STARTUP] == pytest.approx(20)
    assert s.seconds[C.USEFUL] == pytest.approx(20)
    assert any("extrapolated" in x for x in s.assumptions)


def test_an_in_place_requeue_is_two_runs_of_one_attempt_and_the_second_keeps_what_it_resumed_from():
    # run 1: loop at 2, step 10 at 12 (saved at 8 -> run 2 resumes from 8); run 2: beat at 30 (step 8), step 20 at 42
    a = AttemptFacts(1, 0.0, 43.0, None, restarts=1, beats=(
        Beat(2, 0, 0), Beat(12, 10, 0), Beat(30, 8, 8), Beat(42, 20, 8)))
    s = split_attempt(a, None, now=100.0)
    assert (s.steps_kept, s.steps_redone) == (8 + 12, 2)
    assert s.seconds[C.LOST_WORK] == pytest.approx(2)
    assert s.seconds[C.STARTUP] == pytest.approx(2 + 18)  # requeue gap 12 -> 30 counted as the second startup
    assert held_sum(s) == pytest.approx(43)


def test_fleet_summary_rates_and_top_causes():
    pre = split_job("a", preempted_then_resumed(), created=-5.0, now=1000.0)
    killed = split_job("b", [AttemptFacts(1, 0.0, 3600.0, "killed", beats=(Beat(0, 0, 0), Beat(3000, 10, 0)))],
                       created=0.0, now=1e4)
    rep = summarize([pre, killed])
    assert rep["jobs"] == 2 and rep["held_s"] == pytest.approx(3656)
    assert rep["preemptions"] == 1 and rep["preemptions_per_hour"] == pytest.approx(3600 / 3656)
    assert rep["unsignalled_failures"] == 1 and rep["mtbf_unsignalled_s"] == pytest.approx(3656)
    assert rep["top_badput"][0] == {"category": "teardown", "cause": "killed", "seconds": pytest.approx(600)}
    # waiting is wall time, not held: ranked on its own, never among the badput of held time
    assert all(c["category"] != "waiting" for c in rep["top_badput"])
    assert rep["waiting_by_cause"] == [{"cause": "after preempted", "seconds": 10.0},
                                       {"cause": "queue", "seconds": 5.0}]
    assert rep["gpu_seconds"] is None  # job b's GPU count is unknown
    assert rep["goodput"] == pytest.approx((28.4 + 3000) / 3656)


def test_every_held_second_lands_in_exactly_one_category_for_random_histories():
    rng = random.Random(7)
    for _ in range(300):
        start = rng.uniform(0, 10)
        end = start + rng.uniform(0, 100)
        t, step, stall, beats = start + rng.uniform(-5, 20), rng.randint(0, 5), 0.0, []
        r = step if rng.random() < 0.8 else None
        for _ in range(rng.randint(0, 8)):
            beats.append(Beat(t, step, r, stall if rng.random() < 0.7 else None))
            t += rng.uniform(0, 15)
            step += rng.randint(0, 5)
            stall += rng.uniform(0, 3)
        a = AttemptFacts(1, start, end if rng.random() < 0.8 else None, rng.choice([None, "preempted", "hang"]),
                         stop_requested=rng.uniform(start, end), beats=tuple(beats))
        s = split_attempt(a, rng.choice([None, 0, 3, 10]), now=end)
        assert held_sum(s) == pytest.approx(s.held_s, abs=1e-9)
        assert all(v >= -1e-9 for v in s.seconds.values()), s


def test_a_successful_attempt_without_heartbeats_is_useful_and_one_with_no_step_left_is_startup():
    plain = split_attempt(AttemptFacts(1, 0.0, 5.0, None), None, now=100.0)  # `sh -c ...`: no kit, exit 0
    assert plain.seconds[C.USEFUL] == 5 and any("no heartbeats" in x for x in plain.assumptions)
    # resumed at max_steps after a preemption on the last step: it only restored and wrote the result
    finisher = split_attempt(AttemptFacts(2, 0.0, 4.0, None, beats=(Beat(3, 60, 60),)), None, now=100.0)
    assert finisher.seconds[C.STARTUP] == 4 and finisher.seconds[C.FAILED_ATTEMPT] == 0


def test_an_in_place_restart_the_scheduler_called_a_node_failure_is_no_preemption():
    # restarts=1, but Slurm said NODE_FAIL for the earlier run (goodputview passes 0 preempted restarts).
    beats = (Beat(2, 0, 0), Beat(12, 10, 0), Beat(30, 8, 8), Beat(42, 20, 8))
    node_fail = split_job("a", [AttemptFacts(1, 0.0, 43.0, None, restarts=1, preempted_restarts=0, beats=beats)],
                          created=0.0, now=100.0)
    unknown = split_job("b", [AttemptFacts(1, 0.0, 43.0, None, restarts=1, beats=beats)], created=0.0, now=100.0)
    assert summarize([node_fail])["preemptions"] == 0
    assert summarize([unknown])["preemptions"] == 1  # no account of why: counted as before


def _attempt_files(tmp_path, started_at: str, ended_at: str):
    """An attempt row (as goodputview reads it) and its run dir, with the job-writable records given."""
    from datetime import datetime
    from types import SimpleNamespace

    from orchestrator import protocol
    from orchestrator.protocol.exitrecord import ExitRecord, write_exit

    adir = protocol.attempt_dir(str(tmp_path), 1)
    adir.mkdir(parents=True)
    protocol.atomic_write_json(adir / protocol.WRAPPER_FILE, {"token": "t1", "started_at": started_at})
    write_exit(adir, ExitRecord(token="t1", returncode=0, ended_at=ended_at))
    return SimpleNamespace(n=1, token="t1", restarts=0, submitted_at=datetime(2026, 6, 1, 12, 0, 0),
                           started_at=datetime(2026, 6, 1, 12, 1, 0), ended_at=datetime(2026, 6, 1, 13, 0, 0))


def test_the_held_time_takes_the_wrappers_times_only_inside_what_the_db_saw(tmp_path):
    """wrapper.json and exit.json are the job's to write: forged a year apart, `orch report` held a year. A
    time outside submission .. observed start (or start .. observed end) is ignored; one inside is used."""
    from orchestrator.views.goodputview import held_interval

    db_start, db_end = 1780315260.0, 1780318800.0  # 2026-06-01 12:01:00 and 13:00:00 UTC
    forged = _attempt_files(tmp_path / "forged", "2025-06-01T12:00:30+00:00", "2027-06-01T13:00:00+00:00")
    assert held_interval(forged, str(tmp_path / "forged")) == (db_start, db_end)
    early = _attempt_files(tmp_path / "early", "2026-06-01T11:00:00+00:00", "2026-06-01T11:59:00+00:00")
    assert held_interval(early, str(tmp_path / "early")) == (db_start, db_end)  # before submission; end < start
    honest = _attempt_files(tmp_path / "honest", "2026-06-01T12:00:30+00:00", "2026-06-01T12:59:10+00:00")
    assert held_interval(honest, str(tmp_path / "honest")) == (db_start - 30, db_end - 50)
    # Ended between two reconcile passes, never seen running: the wrapper's start, up to the observed end.
    unseen = _attempt_files(tmp_path / "unseen", "2026-06-01T12:00:30+00:00", "2026-06-01T12:59:10+00:00")
    unseen.started_at = None
    assert held_interval(unseen, str(tmp_path / "unseen")) == (db_start - 30, db_end - 50)
    # Never seen running, and its wrapper record forged: held from its submission, not "nothing held" (issue 45).
    # Each bound that ignored a record says so.
    notes: list[str] = []
    hidden = _attempt_files(tmp_path / "hidden", "2099-06-01T12:00:30+00:00", "2027-06-01T13:00:00+00:00")
    hidden.started_at = None
    assert held_interval(hidden, str(tmp_path / "hidden"), notes) == (db_start - 60, db_end)
    assert len(notes) == 3 and "2099-06-01T12:00:30" in notes[0] and "ignored" in notes[0], notes
    assert "held from its submission" in notes[1] and "held until a pass saw it end" in notes[2], notes


def test_a_wrapper_time_within_the_clock_slack_past_what_the_db_saw_is_clamped_to_it(tmp_path):
    """CLOCK_SLACK_S lets a node's clock run a little ahead of the controller's: a wrapper start up to 5 s after the
    observed start, or an exit up to 5 s after the observed end, is accepted, but never stretches the hold past
    what the DB saw (the start is the earlier of the two, the end the earlier of the two)."""
    from orchestrator.views.goodputview import CLOCK_SLACK_S, held_interval

    db_start, db_end = 1780315260.0, 1780318800.0  # 2026-06-01 12:01:00 and 13:00:00 UTC
    assert CLOCK_SLACK_S > 3
    late = _attempt_files(tmp_path / "late", "2026-06-01T12:01:03+00:00", "2026-06-01T13:00:03+00:00")
    assert held_interval(late, str(tmp_path / "late")) == (db_start, db_end)


def test_an_attempt_killed_with_its_wrapper_is_held_until_its_last_heartbeat(tmp_path):
    """A kill -9 of the whole session leaves no exit record; the hold ended at the reconcile pass that
    noticed (up to a cron interval of held `teardown` per kill). It ends at the newest heartbeat, inside what the DB
    saw: a heartbeat time after the observed end, or before the start, is ignored."""
    from orchestrator import protocol
    from orchestrator.views.goodputview import held_interval

    db_start, db_end = 1780315260.0, 1780318800.0  # 2026-06-01 12:01:00 and 13:00:00 UTC
    for name, beat, want in (("killed", db_end - 42.5, db_end - 42.5), ("forged-late", db_end + 3600, db_end),
                             ("forged-early", db_start - 3600, db_end)):
        a = _attempt_files(tmp_path / name, "2026-06-01T12:01:00+00:00", "2026-06-01T13:00:00+00:00")
        (protocol.attempt_dir(str(tmp_path / name), 1) / "exit.json").unlink()
        protocol.write_progress(str(tmp_path / name), 1, step=7, time=beat)
        assert held_interval(a, str(tmp_path / name)) == (db_start, want), name


def test_an_attempt_restarted_in_place_starts_at_its_first_runs_wrapper_record(tmp_path):
    """A Slurm rerun in place sets the first run's wrapper.json aside (wrapper.prev-1.json): the hold starts where
    that first run began, not where a pass first saw the attempt run (it saw only the rerun)."""
    from orchestrator import protocol
    from orchestrator.views.goodputview import held_interval

    db_start, db_end = 1780315260.0, 1780318800.0
    a = _attempt_files(tmp_path, "2026-06-01T12:00:50+00:00", "2026-06-01T12:59:10+00:00")
    adir = protocol.attempt_dir(str(tmp_path), 1)
    protocol.set_aside(adir / protocol.WRAPPER_FILE)  # what the rerun's wrapper does first
    protocol.atomic_write_json(adir / protocol.WRAPPER_FILE, {"token": "t1", "started_at": "2026-06-01T12:30:00+00:00"})
    a.restarts = 1
    assert held_interval(a, str(tmp_path)) == (db_start - 10, db_end - 50)
    assert [r["run"] for r in protocol.run_records(str(tmp_path), 1, "t1")] == [0, 1]
    assert protocol.run_records(str(tmp_path), 1, "other")[0]["started_at"] is None  # another token's: not read


def test_the_schedulers_runs_are_the_held_time_and_the_queue_between_them_is_waiting():
    """The same in-place requeue with the scheduler's account of its two runs (sacct: 0 -> 13, then 28 -> 43): the
    queue between them (13 -> 28) is waiting after a preemption, not a second start-up; each run's tail is its own
    teardown. Held: 13 + 15 = 28 s (issue 45: 43 s were counted held, the queue time among them)."""
    a = AttemptFacts(1, 0.0, 43.0, None, restarts=1, beats=(
        Beat(2, 0, 0), Beat(12, 10, 0), Beat(30, 8, 8), Beat(42, 20, 8)),
        holds=((0.0, 13.0), (28.0, 43.0)), run_causes=("preempted",))
    job = split_job("j", [a], created=0.0, now=100.0)
    s = job.attempts[0]
    assert (s.held_s, s.runs, s.held_from) == (28.0, 2, "scheduler")
    assert (s.steps_kept, s.steps_redone) == (8 + 12, 2)
    assert s.seconds[C.STARTUP] == pytest.approx(2 + 2)
    assert s.seconds[C.USEFUL] == pytest.approx(8 + 12)
    assert s.seconds[C.LOST_WORK] == pytest.approx(2)
    assert s.seconds[C.TEARDOWN] == pytest.approx(1 + 1)
    assert held_sum(s) == pytest.approx(28)
    assert job.waiting == [(0.0, "queue"), (15.0, "preempted")]
    assert job.seconds[C.WAITING] == 15.0


def test_a_run_still_holding_and_a_run_with_no_heartbeat_are_counted_from_the_schedulers_account():
    # run 1 (0 -> 10) was preempted in its start-up: no beat, time in a failed run; run 2 (20 -> ...) still runs.
    a = AttemptFacts(1, 0.0, None, None, restarts=1, beats=(Beat(22, 0, 0), Beat(32, 10, 0)),
                     holds=((0.0, 10.0), (20.0, None)))
    s = split_attempt(a, None, now=40.0)
    assert s.held_s == 30.0 and s.waits == [(10.0, "restart")]
    assert s.seconds[C.FAILED_ATTEMPT] == 10.0
    assert (s.seconds[C.STARTUP], s.seconds[C.USEFUL], s.seconds[C.TEARDOWN]) == pytest.approx((2, 10, 8))
    assert held_sum(s) == pytest.approx(30)


@pytest.mark.parametrize("shift", [-365 * 86400.0, 365 * 86400.0])
def test_heartbeats_dated_outside_the_held_time_are_ignored_and_named(shift):
    """The job writes its heartbeats' times: dated a year back they made held time vanish, a year ahead they made it
    all start-up. The hold stays what orch saw; the beats are ignored, and the assumptions say so."""
    beats = tuple(Beat(t + shift, step, 0) for t, step in ((10, 0), (20, 10), (30, 20)))
    s = split_attempt(AttemptFacts(1, 0.0, 40.0, None, beats=beats), None, now=100.0)
    assert s.held_s == 40.0 and held_sum(s) == pytest.approx(40.0)
    assert s.seconds[C.USEFUL] == 40.0  # succeeded, nothing to split by: counted as for a program without beats
    assert any("3 heartbeat(s) dated outside its held time ignored" in x for x in s.assumptions), s.assumptions


def test_stored_scheduler_runs_of_the_wrong_shape_are_no_account():
    from orchestrator.views.goodputview import scheduler_runs

    assert scheduler_runs([[1.0e9, 1.0e9 + 5], [1.0e9 + 9, None]]) == ((1.0e9, 1.0e9 + 5), (1.0e9 + 9, None))
    for bad in (None, "x", [[1.0e9]], [[True, None]], [["1", None]], [[1.0e9, "end"]], [[-5, None]]):
        assert scheduler_runs(bad) == (), bad


def test_steps_a_run_reported_after_its_last_heartbeat_are_counted_out_of_its_tail():
    """A kill lands between two heartbeats: a node killed at step 119 after a beat at step 100 had 19 steps
    computed again and 0 lost_work (measured on the dev cluster). The run's own report (an in-place restart's
    set-aside failure.json, the attempt's failure_step) names the step reached; those steps take the run's step
    time out of its tail, kept up to where the next run resumed and lost after."""
    # run 1 (0 -> 30): 1 s/step, last beat step 10 at t=12, reported 15; run 2 (40 -> 60) resumed from 10, last
    # beat step 20 at t=52, then killed: reported 25 (its beats name no save: what they saw counts as kept, as
    # before; the 5 steps after them, unseen and after a failure, are lost).
    a = AttemptFacts(1, 0.0, 60.0, "killed", restarts=1, beats=(
        Beat(2, 0, 0), Beat(12, 10, 0), Beat(42, 10, 10), Beat(52, 20, 10)),
        holds=((0.0, 30.0), (40.0, 60.0)), run_causes=("node_fail",), run_steps=(15,), failure_step=25)
    s = split_attempt(a, None, now=100.0)
    assert (s.steps_computed, s.steps_kept, s.steps_redone) == (10 + 5 + 10 + 5, 20, 10), s
    assert s.seconds[C.LOST_WORK] == pytest.approx(5 + 5)  # each run's 5 steps after its last beat
    assert s.seconds[C.TEARDOWN] == pytest.approx((30 - 17) + (60 - 57))
    assert held_sum(s) == pytest.approx(50)
    # reported steps that would need more time than the tail has: counted within it, and said
    b = AttemptFacts(1, 0.0, 13.0, "killed", beats=(Beat(2, 0, 0), Beat(12, 10, 0)), failure_step=40)
    t = split_attempt(b, None, now=100.0)
    assert t.seconds[C.LOST_WORK] == pytest.approx(1) and held_sum(t) == pytest.approx(13)  # the 1 s tail
    assert any("take longer than the time left" in x for x in t.assumptions), t.assumptions


def test_goodput_over_time_spreads_each_attempts_useful_share_over_the_buckets_it_held():
    from orchestrator.core.goodputtime import held_over_time

    # a: held 0 -> 40, no beats and it succeeded: all 40 s useful; b (another partition): held 50 -> 70, failed
    # with no beats: 20 s failed_attempt. Buckets of 30 s from 0 to 90: a holds 30 s of bucket 0 and 10 s of bucket
    # 1, b 10 s of bucket 1 and 10 s of bucket 2; nothing falls in a bucket neither held.
    a = split_job("a", [AttemptFacts(1, 0.0, 40.0, None)], 0.0, 100.0, {"partition": "p/one"})
    b = split_job("b", [AttemptFacts(1, 50.0, 70.0, "crash")], 0.0, 100.0, {"partition": "p/two"})
    got = held_over_time([a, b], "partition", 0.0, 90.0, 30.0)
    assert got == {"p/one": [(30.0, 30.0), (10.0, 10.0), (0.0, 0.0)], "p/two": [(0.0, 0.0), (10.0, 0.0), (10.0, 0.0)]}
    # an attempt partly useful (the preempted attempt of the timeline above, alone: 40 s held) counts its useful
    # share of each second it held
    j = split_job("j", preempted_then_resumed()[:1], 0.0, 100.0, {"partition": "x"})
    (first,) = j.attempts
    share = first.seconds[C.USEFUL] / first.held_s
    assert 0 < share < 1 and first.held_s == 40.0
    (b0, b1) = held_over_time([j], "partition", 0.0, 40.0, 20.0)["x"]
    assert b0 == pytest.approx((20.0, 20.0 * share)) and b1 == pytest.approx((20.0, 20.0 * share))
    # held time outside the window is left out; a group with no key is left out
    assert held_over_time([a, b], "partition", 35.0, 55.0, 10.0) == {"p/one": [(5.0, 5.0), (0.0, 0.0)],
                                                                    "p/two": [(0.0, 0.0), (5.0, 0.0)]}
    assert held_over_time([a], "sweep", 0.0, 90.0, 30.0) == {}


def test_goodput_over_time_picks_whole_buckets_ending_now_and_leaves_a_gap_where_nothing_was_held():
    from datetime import timedelta

    from orchestrator.views.goodputview import goodput_over_time

    now = 10 * 86400.0
    a = split_job("a", [AttemptFacts(1, now - 3 * 3600, now - 2 * 3600, None)], 0.0, now, {"partition": "p"})
    day = goodput_over_time([a], timedelta(hours=24), now)
    assert (day["start"], day["width_s"]) == (now - 86400, 3600)  # 24 h: hourly
    assert day["groups"]["p"][-3] == 1.0 and day["groups"]["p"][-1] is None  # held 3 h ago; nothing since: a gap
    assert day["held_s"]["p"][-3] == 3600.0 and len(day["groups"]["p"]) == 24
    week = goodput_over_time([a], timedelta(days=7), now)
    assert week["width_s"] == 6 * 3600 and len(week["groups"]["p"]) == 28
    everything = goodput_over_time([a], None, now)  # from the first held second, in whole hours
    assert everything["start"] == now - 3 * 3600 and everything["groups"]["p"] == [1.0, None, None]
    # a hold that began at a time no clock shows (a wrong clock, a garbage record) costs no more than 100 years
    early = split_job("e", [AttemptFacts(1, -1e18, now - 3600, None)], -1e18, now, {"partition": "p"})
    nan = split_job("n", [AttemptFacts(1, float("nan"), now, None)], 0.0, now, {"partition": "q"})
    wide = goodput_over_time([a, early, nan], None, now)
    assert wide["width_s"] == 365 * 86400 and len(wide["groups"]["p"]) <= 101 and wide["groups"]["q"][-1] is None
