"""The run dir's tracker lock (jobside/trackerlock.py): a mark of a job's end made after a newer attempt exists is
skipped and said in one line; a stopped holder costs the mark child one line and the next attempt's wrapper
nothing but a line (it goes on). The race itself, with a real MLflow store and real commands:
tests/integrations/test_tracker_requeue_race.py."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys

import pytest
from orchkit import wait_for

from orchestrator import protocol
from orchestrator.jobside import trackerfinish, trackerlock, wrapper

HOLD = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600); "
        "fcntl.flock(fd, fcntl.LOCK_EX); open(sys.argv[1] + '.held', 'w').close(); time.sleep(120)")


def _run_dir(tmp_path, attempts: int):
    run_dir = tmp_path / "run"
    for n in range(1, attempts + 1):
        protocol.attempt_dir(run_dir, n).mkdir(parents=True)
    protocol.write_tracker(run_dir, "mlflow", {"run_id": "r1", "tracking_uri": f"sqlite:///{tmp_path}/none.db"})
    return run_dir


def test_superseded_only_by_a_newer_attempt_dir(tmp_path):
    run_dir = _run_dir(tmp_path, 1)
    assert not trackerlock.superseded(run_dir, 1) and not trackerlock.superseded(run_dir, None)
    (run_dir / "attempts" / "notes").mkdir()  # not an attempt
    assert not trackerlock.superseded(run_dir, 1)
    protocol.attempt_dir(run_dir, 2).mkdir()
    assert trackerlock.superseded(run_dir, 1) and not trackerlock.superseded(run_dir, 2)
    assert protocol.newest_attempt(tmp_path / "gone") is None


def test_a_mark_after_a_newer_attempt_is_skipped_in_one_line_and_writes_nothing(tmp_path, capsys):
    run_dir = _run_dir(tmp_path, 2)
    before = (run_dir / protocol.TRACKERS_FILE).read_bytes()
    assert trackerfinish.finish_many(json.dumps([[str(run_dir), "cancelled", 1]])) == 0
    out = capsys.readouterr()
    assert out.out == f"{run_dir}: not marked cancelled: attempt 2 was made since\n" and out.err == ""
    assert (run_dir / protocol.TRACKERS_FILE).read_bytes() == before


@pytest.mark.timeout(60)  # a stopped holder is not waited for: the child's 60 s would fail here
def test_a_stopped_holder_costs_the_mark_one_line_and_the_wrapper_goes_on(tmp_path, capsys, monkeypatch):
    run_dir = _run_dir(tmp_path, 1)
    lock = trackerlock.lock_path(run_dir)
    assert lock == tmp_path / ".orch-locks" / "run.trackers.lock"  # beside the run dir, not in it
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)])
    try:
        wait_for(lambda: lock.with_name(lock.name + ".held").exists(), 30, "the holder took the lock")
        os.kill(p.pid, signal.SIGSTOP)
        assert trackerfinish.finish_many(json.dumps([[str(run_dir), "cancelled", 1]])) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"{run_dir}: not marked cancelled: the tracker lock {lock} is held by pid {p.pid}") \
            and err.count("\n") == 1 and "not waited for" in err, err
        arranged = []
        monkeypatch.setattr(wrapper.mlflowrun, "arrange", lambda *a: arranged.append(a) or (None, ""))
        log = io.BytesIO()
        assert wrapper._arrange_trackers(run_dir, "j", 2, {}, log) == (None, "")
        assert len(arranged) == 1 and b"is held by pid" in log.getvalue() and b"going on without it" in log.getvalue()
    finally:
        p.kill()
        p.wait()


def test_no_lock_file_is_made_where_there_is_no_tracker_run(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    protocol.attempt_dir(run_dir, 1).mkdir(parents=True)
    monkeypatch.setattr(wrapper.mlflowrun, "arrange", lambda *a: (None, ""))
    assert wrapper._arrange_trackers(run_dir, "j", 1, {}, io.BytesIO()) == (None, "")
    assert trackerfinish.finish_many(json.dumps([[str(run_dir), "failed", 1]])) == 0
    assert not (tmp_path / protocol.LOCKS_DIR).exists()


def test_a_symlinked_locks_dir_is_refused_and_nothing_is_made_where_it_points(tmp_path, capsys):
    run_dir = _run_dir(tmp_path, 1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / protocol.LOCKS_DIR).symlink_to(elsewhere)
    assert trackerfinish.finish_many(json.dumps([[str(run_dir), "cancelled", 1]])) == 1
    assert capsys.readouterr().err == (f"{run_dir}: not marked cancelled: {tmp_path / protocol.LOCKS_DIR} is not a "
                                       "directory of orch's (a symlink or a file)\n")
    assert list(elsewhere.iterdir()) == []
