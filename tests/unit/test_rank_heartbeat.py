"""Every rank's progress is observable: rank 0 writes progress.json as ever, every other rank of a
multi-rank job its own small ``attempts/<n>/progress.rank-<r>.json``, only when its loop posted progress, so a
hung rank's file stops changing; a job that is not multi-rank gets no per-rank file."""

from __future__ import annotations

import json
import os

import pytest

from orchestrator import protocol
from orchestrator.kit import heartbeat


def _names(run_dir) -> list[str]:
    d = protocol.attempt_dir(run_dir, 1)
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def test_rank_1_writes_its_own_step_only_and_only_after_a_post(tmp_path):
    hb = heartbeat.for_rank(tmp_path, 1, 3600, writer=False, rank=1, world=2)  # the thread never wakes by itself
    assert hb is not None
    try:
        hb.post(step=40, loss=0.5, max_steps=100)
        hb.write_now()
        path = protocol.attempt_dir(tmp_path, 1) / protocol.RANK_PROGRESS.format(1)
        assert _names(tmp_path) == [path.name]  # never rank 0's progress.json, no history
        rec = json.loads(path.read_text())
        assert (rec["rank"], rec["step"]) == (1, 40) and protocol.read_step(path) == 40
        os.utime(path, (1000.0, 1000.0))
        hb.write_now()  # nothing posted since: a hung rank's file must keep its age
        assert path.stat().st_mtime == 1000.0
        hb.post(step=41)
        hb.write_now()
        assert path.stat().st_mtime > 1000.0 and protocol.read_step(path) == 41
        assert list(protocol.progress_files(tmp_path, 1, 2)) == [0, 1]  # rank 0's path whether written or not
    finally:
        hb.stop()


def test_rank_0_and_a_one_process_job_write_progress_json_as_before(tmp_path):
    for writer, rank, world in ((True, 0, 2), (True, 0, 1)):
        run_dir = tmp_path / f"{rank}-{world}"
        hb = heartbeat.for_rank(run_dir, 1, 3600, writer=writer, rank=rank, world=world)
        assert hb is not None
        hb.post(step=7)
        hb.stop()
        assert _names(run_dir) == [protocol.PROGRESS_FILE, protocol.PROGRESS_HISTORY]
        progress = protocol.read_progress(run_dir, 1)
        assert progress["step"] == 7
        # rank 0 of several says so (the detector then reads the other ranks' files); one process: as before
        assert progress.get("world_size") == (2 if world == 2 else None), progress


def test_no_per_rank_file_when_the_world_is_one_rank(tmp_path):
    # RANK=1 without a process group of several ranks (a torchrun script that never called init): as today
    assert heartbeat.for_rank(tmp_path, 1, 3600, writer=False, rank=1, world=1) is None
    assert heartbeat.for_rank(tmp_path, 1, 3600, writer=False, rank=0, world=1) is None


ORCH_ENV = {"ORCH_ATTEMPT": "1", "WORLD_SIZE": "2", "ORCH_HEARTBEAT_S": "3600"}  # no refresh during a test


def _arm(env: dict) -> heartbeat.Armed | None:
    """Arm as the kit does, then stop the refresher (the test sets the times itself)."""
    armed = heartbeat.arm_from_env(env)
    if armed is not None:
        armed.stop()
    return armed


def test_a_rank_arms_as_its_program_starts_only_under_orch_and_torchrun(tmp_path):
    """The kit says, before the process group forms, that this program beats (armed.rank-<r>.json)."""
    assert _arm({**ORCH_ENV, "ORCH_RUN_DIR": str(tmp_path), "RANK": "1"}) is not None
    assert protocol.armed_ranks(tmp_path, 1) == {1: 2}
    for env in ({**ORCH_ENV, "RANK": "0"},  # not under orch
                {**ORCH_ENV, "ORCH_RUN_DIR": str(tmp_path / "one"), "WORLD_SIZE": "1"},  # one process
                {**ORCH_ENV, "ORCH_RUN_DIR": str(tmp_path / "bad"), "RANK": "2"},  # no rank of this world
                {**ORCH_ENV, "ORCH_RUN_DIR": str(tmp_path / "nan"), "WORLD_SIZE": "two"}):
        assert _arm(env) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attempts"]


def test_an_armed_record_is_refreshed_until_the_process_first_beats(tmp_path):
    """The record's mtime says the rank is alive in its start (a slow restore); its first heartbeat ends that."""
    from orchkit import wait_for

    path = protocol.attempt_dir(tmp_path, 1) / protocol.RANK_ARMED.format(1)
    heartbeat._beat.clear()  # an earlier test's heartbeat in this process beat
    armed = heartbeat.arm_from_env({**ORCH_ENV, "ORCH_RUN_DIR": str(tmp_path), "RANK": "1", "ORCH_HEARTBEAT_S": "0.05"})
    try:
        os.utime(path, (1000, 1000))
        wait_for(lambda: path.stat().st_mtime > 1000, 30, "the armed record to be refreshed", interval=0.02)
        assert json.loads(path.read_text())["since"] < path.stat().st_mtime  # the first arming is kept
        hb = heartbeat.for_rank(tmp_path, 1, 3600, writer=False, rank=1, world=2)
        hb.post(step=1)
        hb.write_now()  # the first beat
        assert heartbeat._beat.is_set()
        armed._thread.join(timeout=30)
        assert not armed._thread.is_alive()
        hb.stop()
    finally:
        heartbeat._beat.clear()
        armed.stop()


def test_armed_records_are_read_bounded_and_checked(tmp_path):
    d = protocol.attempt_dir(tmp_path, 1)
    d.mkdir(parents=True)
    (d / protocol.RANK_ARMED.format(0)).write_text('{"rank": 0, "world_size": 4}')
    (d / protocol.RANK_ARMED.format(1)).write_text('{"rank": 7, "world_size": 4}')  # no rank of its world
    (d / protocol.RANK_ARMED.format(2)).write_text('{"rank": 2, "world_size": 100000000}')  # past any world
    (d / protocol.RANK_ARMED.format(3)).write_text("garbage")
    os.mkfifo(d / protocol.RANK_ARMED.format(4))  # never blocks a pass
    assert protocol.armed_ranks(tmp_path, 1) == {0: 4}


def _started(run_dir, at: float) -> None:
    """The attempt's wrapper record, written at ``at`` (the attempt's start, for the hang detector)."""
    d = protocol.attempt_dir(run_dir, 1)
    d.mkdir(parents=True, exist_ok=True)
    (d / protocol.WRAPPER_FILE).write_text("{}")
    os.utime(d / protocol.WRAPPER_FILE, (at, at))


def _armed(run_dir, rank: int, at: float) -> None:
    """Rank ``rank`` of 2 armed, its record last refreshed at ``at``."""
    _arm({**ORCH_ENV, "ORCH_RUN_DIR": str(run_dir), "RANK": str(rank)})
    path = protocol.attempt_dir(run_dir, 1) / protocol.RANK_ARMED.format(rank)
    os.utime(path, (at, at))


def test_a_rank_that_never_arms_is_hung_after_the_timeout_from_the_first_arming_and_named(tmp_path):
    """Rank 1 stopped before the process group formed; rank 0 waited in init_process_group and never beat:
    no heartbeat at all, so nothing was judged. Armed, the start is judged: rank 1 never even armed."""
    from orchestrator.decide.staleness import judge

    now = 10_000.0
    _started(tmp_path, now - 3600)
    _armed(tmp_path, 0, now - 1)
    json_path = protocol.attempt_dir(tmp_path, 1) / protocol.RANK_ARMED.format(0)
    json_path.write_text(json.dumps({"rank": 0, "world_size": 2, "since": now - 30}))  # first armed 30 s ago
    os.utime(json_path, (now - 1, now - 1))  # and alive: refreshed a second ago
    assert judge(tmp_path, 1, 60, now) is None  # within the timeout of rank 0's arming
    stale = judge(tmp_path, 1, 20, now)
    assert (stale.rank, stale.step, round(stale.age_s)) == (1, None, 30), stale
    assert stale.describe() == "rank 1: no progress for 30 s, before any step heartbeat"
    # A job whose ranks never armed (a plain script, no kit) is not judged before it beats, as ever.
    _started(tmp_path / "plain", now - 3600)
    assert judge(tmp_path / "plain", 1, 20, now) is None


def test_an_armed_rank_whose_record_is_no_longer_refreshed_is_hung_and_named(tmp_path):
    """A rank stopped (SIGSTOP) after it armed, before its group formed: its refresher stopped with it, while rank 0,
    waiting in init_process_group, still refreshes. The rank whose record is oldest is named."""
    from orchestrator.decide.staleness import judge

    now = 10_000.0
    _started(tmp_path, now - 3600)
    _armed(tmp_path, 0, now - 1)
    _armed(tmp_path, 1, now - 30)
    assert judge(tmp_path, 1, 60, now) is None
    stale = judge(tmp_path, 1, 20, now)
    assert (stale.rank, stale.step, round(stale.age_s)) == (1, None, 30), stale
    # Its own heartbeat (rank 1 beat; rank 0 is still in its restore) says it is alive: not judged.
    protocol.write_rank_progress(tmp_path, 1, 1, 3)
    os.utime(protocol.attempt_dir(tmp_path, 1) / protocol.RANK_PROGRESS.format(1), (now - 2, now - 2))
    assert judge(tmp_path, 1, 20, now) is None


def test_a_slow_start_of_ranks_that_all_armed_is_never_judged_before_a_beat(tmp_path):
    """CI: a healthy resume was stopped as hung. Its ranks' torch imports and restore took longer than the timeout
    counted from the attempt's start (wrapper.json). Counted from the first arming, and an armed rank alive in its
    restore (its record refreshed) is never hung, however long the restore."""
    from orchestrator.decide.staleness import judge

    now = 10_000.0
    _started(tmp_path, now - 3600)  # an hour since the start: a slow import is not a rank that never arms
    assert judge(tmp_path, 1, 20, now) is None
    _armed(tmp_path, 0, now - 10)
    assert judge(tmp_path, 1, 20, now) is None
    _armed(tmp_path, 1, now - 1)
    _armed(tmp_path, 0, now - 1)
    assert judge(tmp_path, 1, 20, now) is None  # both alive: a restore of any length is not judged before a beat


def test_armed_records_of_a_previous_run_of_the_attempt_are_ignored(tmp_path):
    """A Slurm in-place requeue restarts the attempt (wrapper.json rewritten): the last run's records, long
    unrefreshed, would make the new run hung at once."""
    from orchestrator.decide.staleness import judge

    now = 10_000.0
    _armed(tmp_path, 0, now - 500)
    _started(tmp_path, now - 5)
    assert judge(tmp_path, 1, 20, now) is None


def test_a_program_its_wrapper_saw_stopped_for_the_timeout_is_hung_whatever_it_wrote(tmp_path):
    """Hostile pass: a program stopped before its first heartbeat (or torchrun before any rank started)
    was never judged. The wrapper's record (program-stopped.json, dated when it first saw the program stopped)
    decides; a record older than the attempt's (re)start is a previous run's."""
    from orchestrator.decide.staleness import judge

    now = 10_000.0
    _started(tmp_path, now - 3600)
    stopped = protocol.attempt_dir(tmp_path, 1) / protocol.PROGRAM_STOPPED
    stopped.write_text("{}")
    os.utime(stopped, (now - 30, now - 30))
    assert judge(tmp_path, 1, 60, now) is None  # stopped 30 s: within the timeout
    stale = judge(tmp_path, 1, 20, now)
    assert (stale.rank, stale.step, round(stale.age_s)) == (None, None, 30), stale
    _started(tmp_path, now - 5)  # an in-place requeue since: the record is the last run's
    assert judge(tmp_path, 1, 20, now) is None


@pytest.mark.parametrize("kind", ["fifo", "symlink", "dir"])
def test_a_non_regular_file_at_the_stopped_record_never_makes_a_job_hung(tmp_path, kind):
    """Hostile pass 3: a FIFO at program-stopped.json (mtime older than the timeout) got a job that beat every
    second stopped as hung, "no heartbeat for 23 s", on every attempt. Only the wrapper's regular file counts."""
    from orchestrator.decide.staleness import judge

    now = 10_000.0
    _started(tmp_path, now - 3600)
    stopped = protocol.attempt_dir(tmp_path, 1) / protocol.PROGRAM_STOPPED
    {"fifo": lambda: os.mkfifo(stopped), "symlink": lambda: stopped.symlink_to(tmp_path / "elsewhere.json"),
     "dir": stopped.mkdir}[kind]()
    (tmp_path / "elsewhere.json").write_text("{}")
    for path in (stopped, tmp_path / "elsewhere.json"):
        os.utime(path, (now - 30, now - 30), follow_symlinks=False)
    assert judge(tmp_path, 1, 20, now) is None
