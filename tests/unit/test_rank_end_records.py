"""Each rank's own end (orchestrator/jobside/rankend.py): the record the per-rank parent writes is the
job's to write too, so every field is checked; the wrapper picks the rank that failed on its own first; and
classify() gives the attempt the class a single process with that end gets, never more.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from orchkit import wait_for

from orchestrator import protocol
from orchestrator.backends.base import Outcome, Phase
from orchestrator.decide.classify import classify
from orchestrator.jobside import rankend
from orchestrator.jobside.rankend import RankEnd, first_own_end, parse_rank_end, read_rank_ends
from orchestrator.protocol import ExitRecord, MarkerStatus, Verification

ABSENT = Verification(MarkerStatus.ABSENT, "no done.json")
TOKEN, LAUNCH = "tok", "abc123"
ROOT = Path(__file__).resolve().parents[2]


def good(**kw: object) -> dict:
    return {"token": TOKEN, "launch": LAUNCH, "rank": 1, "returncode": -9, "stopped": False, "at": 10.5, **kw}


def test_a_well_formed_record_is_read():
    assert parse_rank_end(good(), LAUNCH, TOKEN, 1) == RankEnd(1, -9, 10.5, False)


@pytest.mark.parametrize("bad", [
    "garbage", [1, 2], None, 7,
    good(token="other"),  # another attempt's
    good(launch="older"),  # a Slurm in-place rerun's earlier run
    good(rank=0),  # names another rank than its file
    good(rank=True), good(rank="1"),
    good(returncode="-9"), good(returncode=True), good(returncode=-9.0), good(returncode=10**30),
    good(returncode=-65), good(returncode=256),
    good(stopped="false"), good(stopped=0), good(stopped=None),
    good(at="now"), good(at=float("nan")), good(at=float("inf")), good(at=True), good(at=None),
], ids=repr)
def test_a_malformed_record_is_ignored(bad):
    assert parse_rank_end(bad, LAUNCH, TOKEN, 1) is None


def test_read_rank_ends_reads_only_this_launchs_ranks_and_skips_huge_or_broken_files(tmp_path):
    rankend.record_path(tmp_path, LAUNCH, 0).write_text(json.dumps(good(rank=0, returncode=1)))
    rankend.record_path(tmp_path, LAUNCH, 1).write_text(json.dumps(good(detail="x" * (1 << 20))))  # huge
    rankend.record_path(tmp_path, LAUNCH, 2).write_text("{not json")
    rankend.record_path(tmp_path, LAUNCH, 5).write_text(json.dumps(good(rank=5)))  # outside the world
    rankend.record_path(tmp_path, "older", 3).write_text(json.dumps(good(rank=3, launch="older")))
    assert read_rank_ends(tmp_path, LAUNCH, TOKEN, 4) == [RankEnd(0, 1, 10.5, False)]
    assert read_rank_ends(tmp_path / "absent", LAUNCH, TOKEN, 4) == []


def test_first_own_end_is_the_earliest_failure_not_reached_by_a_stop():
    killed, lost_peer = RankEnd(1, -9, 10.0, False), RankEnd(0, 1, 10.2, False)
    closed = RankEnd(2, -15, 9.0, True)  # torchrun's own SIGTERM to a survivor: a consequence
    clean = RankEnd(3, 0, 1.0, False)
    assert first_own_end([lost_peer, closed, clean, killed]) == killed
    assert first_own_end([closed, clean]) is None  # never a clean exit, never a stopped rank
    assert first_own_end([RankEnd(1, 1, 5.0, False), RankEnd(0, 1, 5.0, False)]).rank == 0


def test_a_signal_no_peer_can_cause_wins_over_an_abort_recorded_before_it():
    """The survivor's gloo abort (SIGABRT) for the lost peer can be recorded before the SIGKILL that caused it
    (seen: 0.6 ms earlier on a loaded machine); an exit code or SIGABRT is what a peer's death causes."""
    aborted, killed = RankEnd(0, -6, 10.0000, False), RankEnd(1, -9, 10.0006, False)
    assert first_own_end([aborted, killed]) == killed
    raised, segv = RankEnd(0, 1, 3.0, False), RankEnd(1, -11, 4.0, False)
    assert first_own_end([raised, segv]) == segv

def test_a_rank_that_raised_wins_over_an_abort_recorded_before_its_exit():
    """Its teardown closes its process group (the peer's gloo aborts) before its own exit is seen: on a loaded
    machine the peer's SIGABRT was recorded first and the record named rank 0, not the rank that raised."""
    assert first_own_end([RankEnd(0, -6, 2.0, False), RankEnd(1, 1, 3.0, False)]).rank == 1
    assert first_own_end([RankEnd(0, 1, 2.0, False), RankEnd(1, 1, 1.0, False)]).rank == 1  # exit codes: by time


def test_an_abort_names_its_rank_only_when_no_other_rank_can_have_caused_it():
    """SIGABRT is what a lost peer does to a rank. CI, stops 26 and 27: rank 1 raised and then aborted itself on its
    way out (both ranks -6), or was stopped by torchrun after rank 0's abort was seen (rank 1 -15, stopped); naming
    the earliest abort named rank 0, which only lost its peer. The ends cannot tell, so no rank is named."""
    assert first_own_end([RankEnd(0, -6, 2.0, False), RankEnd(1, -6, 1.0, False)]) is None
    assert first_own_end([RankEnd(0, -6, 1796236775.682, False), RankEnd(1, -15, 1796236775.781, True)]) is None
    assert first_own_end([RankEnd(0, -6, 2.0, False)], world_size=2) is None  # the other rank left no record
    # every other rank ended cleanly: nothing was lost before the abort, which is then the rank's own
    assert first_own_end([RankEnd(0, 0, 1.0, False), RankEnd(1, -6, 2.0, False)], world_size=2).rank == 1


def test_a_rank_that_raised_is_named_even_when_torchruns_stop_reached_it_before_its_exit():
    """CI: rank 1 raised, its teardown made rank 0's gloo abort, torchrun saw rank 0 end first and stopped rank 1
    while it was still exiting: rank 1's end was marked stopped and the record named the abort of rank 0."""
    aborted, raised = RankEnd(0, -6, 2.0, False), RankEnd(1, 1, 3.0, True)
    assert first_own_end([aborted, raised]) == raised
    # a stopped rank that exited as a stop does (143), or was killed by the stop's signal, is not named; nor is the
    # abort, which its end may have caused
    assert first_own_end([aborted, RankEnd(1, 143, 3.0, True)]) is None
    assert first_own_end([aborted, RankEnd(1, -15, 3.0, True)]) is None
    # a failure of its own elsewhere outranks a stopped rank's exit code
    assert first_own_end([RankEnd(0, 1, 2.0, False), RankEnd(1, 2, 1.0, True)]).rank == 0


def exit_json(tmp_path, **fields: object) -> ExitRecord | None:
    (tmp_path / protocol.EXIT_FILE).write_text(json.dumps({"token": "t", "returncode": 1, **fields}))
    return protocol.read_exit(tmp_path)


@pytest.mark.parametrize("fields", [
    {"failed_rank": "1", "rank_returncode": -9}, {"failed_rank": 1, "rank_returncode": "-9"},
    {"failed_rank": -1, "rank_returncode": -9}, {"failed_rank": 1, "rank_returncode": 0},
    {"failed_rank": 1, "rank_returncode": True}, {"failed_rank": 1, "rank_returncode": 10**40},
    {"failed_rank": 1}, {"rank_returncode": -9}, {"failed_rank": [1], "rank_returncode": {"x": 1}},
], ids=repr)
def test_exit_json_rank_fields_of_the_wrong_type_or_range_read_as_absent(tmp_path, fields):
    rec = exit_json(tmp_path, **fields)
    assert rec is not None and (rec.failed_rank, rec.rank_returncode) == (None, None)


def test_exit_json_rank_fields_are_read(tmp_path):
    rec = exit_json(tmp_path, failed_rank=3, rank_returncode=-9)
    assert rec is not None and (rec.failed_rank, rec.rank_returncode) == (3, -9)


def test_exit_json_keeps_when_the_program_ended_and_reads_a_bad_value_as_unknown(tmp_path):
    assert exit_json(tmp_path, program_ended_at="2026-06-01T12:00:00.000+00:00").program_ended_at == \
        "2026-06-01T12:00:00.000+00:00"
    assert exit_json(tmp_path, program_ended_at=1780315200).program_ended_at == ""
    assert exit_json(tmp_path).program_ended_at == ""


def ranked(rc: int | None, sig: int | None, rank_rc: int | None, rank: int | None = 1):
    rec = ExitRecord(token="t", returncode=rc if rc is not None else -(sig or 0), failed_rank=rank,
                     rank_returncode=rank_rc)
    return classify(Outcome(Phase.EXITED, exit_code=rc, signal=sig), None, ABSENT, exit_record=rec)


@pytest.mark.parametrize(("rank_rc", "cls", "text"), [
    (-signal.SIGKILL, "killed", "rank 1 killed by SIGKILL"),
    (-signal.SIGSEGV, "crash", "rank 1 killed by signal 11"),
    (-signal.SIGTERM, "preempted", "rank 1 terminated by SIGTERM"),
    (1, "crash", "rank 1 exit 1"),
    (137, "killed", "rank 1"),
])
def test_a_rank_end_is_classified_as_a_single_process_with_that_end(rank_rc, cls, text):
    c = ranked(1, None, rank_rc)
    assert (c.cls.value, text in c.detail, "torchrun exit 1" in c.detail) == (cls, True, True), c


def test_a_rank_end_never_speaks_for_torchrun_exit_0_or_torchrun_killed():
    assert ranked(0, None, -9).cls.value == "marker_missing"  # never a rank's word over a clean run
    c = ranked(None, signal.SIGSEGV, -9)  # torchrun itself died: its own end
    assert c.cls.value == "crash" and "rank" not in c.detail, c
    assert ranked(1, None, None, rank=None).cls.value == "crash"


def test_an_oom_kill_counted_by_the_cgroup_still_wins():
    rec = ExitRecord(token="t", returncode=1, oom_kill=1, failed_rank=0, rank_returncode=-9)
    assert classify(Outcome(Phase.EXITED, exit_code=1), None, ABSENT, exit_record=rec).cls.value == "oom"


def test_the_per_rank_parent_records_the_end_and_ends_as_the_program_did(tmp_path):
    """Real processes: a program SIGKILLed ends its parent by SIGKILL too (torchrun's view stays true) and the
    record says so; a stop sent to the process group (as torchrun sends it) is recorded as ``stopped``."""
    env = {"RANK": "0", protocol.ENV_TOKEN: TOKEN, "PATH": "/usr/bin:/bin"}
    argv = [sys.executable, "-m", "orchestrator.jobside.rankend", "--dir", str(tmp_path), "--launch", LAUNCH, "--"]
    p = subprocess.run([*argv, "sh", "-c", "kill -9 $$"], env=env, timeout=60)
    assert p.returncode == -signal.SIGKILL
    end = read_rank_ends(tmp_path, LAUNCH, TOKEN, 1)[0]
    assert (end.rank, end.returncode, end.stopped) == (0, -9, False)
    p = subprocess.run([*argv, "sh", "-c", "exit 3"], env=env, timeout=60)
    assert p.returncode == 3
    assert read_rank_ends(tmp_path, LAUNCH, TOKEN, 1)[0].returncode == 3
    q = subprocess.Popen([*argv, "sh", "-c", "echo up; exec sleep 60"], env=env, stdout=subprocess.PIPE,
                         start_new_session=True)
    assert q.stdout.readline() == b"up\n"
    os.killpg(q.pid, signal.SIGTERM)  # torchrun's close: the whole group
    assert q.wait(timeout=60) == -signal.SIGTERM
    end = read_rank_ends(tmp_path, LAUNCH, TOKEN, 1)[0]
    assert (end.returncode, end.stopped) == (-signal.SIGTERM, True)
    assert first_own_end([end]) is None


@pytest.mark.timeout(60)  # proves the rule: the program sleeps 600 s, and a stop that waited for it fails here
def test_a_stopped_program_is_killed_at_once_when_a_stop_reaches_its_rank(tmp_path):
    """A stopped rank (SIGSTOP, Ctrl-Z) can never use the grace its stop gives it; the stop's final SIGKILL
    came only after the whole grace, and took this parent too (no record). The parent kills it at once, and records
    the end as the stop's consequence."""
    env = {"RANK": "1", protocol.ENV_TOKEN: TOKEN, "PATH": "/usr/bin:/bin"}
    argv = [sys.executable, "-m", "orchestrator.jobside.rankend", "--dir", str(tmp_path), "--launch", LAUNCH, "--"]
    q = subprocess.Popen([*argv, "sh", "-c", "echo up; kill -STOP $$; exec sleep 600"], env=env,
                         stdout=subprocess.PIPE, start_new_session=True)
    assert q.stdout.readline() == b"up\n"
    wait_for(lambda: _stopped_child(q.pid), 30, "the program to be stopped")
    os.kill(q.pid, signal.SIGTERM)  # the stop reaches the parent (torchrun signals the group; the child's is pending)
    assert q.wait(timeout=30) == -signal.SIGKILL
    end = read_rank_ends(tmp_path, LAUNCH, TOKEN, 2)[0]
    assert (end.rank, end.returncode, end.stopped) == (1, -9, True)


# Run in a child: rankend installs its stop handlers in the process that calls main().
_STOP_DURING_POPEN = """
import os, signal, subprocess, sys, time
from orchestrator.jobside import rankend
real = subprocess.Popen
def popen(*a, **kw):  # the program printed and stopped itself before Popen returned; the stop arrives then
    child = real(*a, **kw)
    while not rankend._is_stopped(child.pid):
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, before main() holds the child
    return child
rankend.subprocess.Popen = popen
sys.exit(rankend.main(sys.argv[1:]))
"""


@pytest.mark.timeout(60)  # the program sleeps 600 s: a stop that waited for it fails here
def test_a_stop_that_comes_while_the_program_starts_still_kills_it_once_stopped(tmp_path):
    """CI (loaded): the program printed and stopped itself before rankend's Popen returned, and the stop arrived
    then: the handler had no child to check, and the stopped program was waited for until the test's bound."""
    env = {"RANK": "1", protocol.ENV_TOKEN: TOKEN, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", _STOP_DURING_POPEN, "--dir", str(tmp_path), "--launch", LAUNCH, "--",
                        "sh", "-c", "kill -STOP $$; exec sleep 600"], env=env, timeout=50)
    assert p.returncode == -signal.SIGKILL
    end = read_rank_ends(tmp_path, LAUNCH, TOKEN, 2)[0]
    assert (end.rank, end.returncode, end.stopped) == (1, -9, True)


def _stopped_child(pid: int) -> bool:
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        if rankend._is_stopped(int(child)):
            return True
    return False


def test_the_wrapper_reads_rank_ends_only_when_torchrun_failed(tmp_path):
    """A rank's record never speaks for a run torchrun called a success (exit 0) or for torchrun's own death."""
    from orchestrator.jobside import wrapper

    a = wrapper._parse(["--run-dir", str(tmp_path), "--job", "j", "--attempt", "1", "--token", TOKEN,
                        "--nproc-per-node", "2", "--", "python", "train.py"])
    d = protocol.attempt_dir(tmp_path, 1) / wrapper.TORCHRUN_DIR
    d.mkdir(parents=True)
    rankend.record_path(d, LAUNCH, 1).write_text(json.dumps(good()))
    assert wrapper._failed_rank(a, LAUNCH, 1, 2) == {"failed_rank": 1, "rank_returncode": -9}
    assert wrapper._failed_rank(a, LAUNCH, 0, 2) == {}
    assert wrapper._failed_rank(a, LAUNCH, -9, 2) == {}
    assert wrapper._failed_rank(a, LAUNCH, 1, None) == {}


def test_the_one_rank_without_a_record_while_every_other_was_stopped_was_killed():
    """Hostile pass 5: kill -9 of rank 0's orch parent (it records every end but its own SIGKILL); torchrun then
    stopped rank 1. The attempt read `preempted` from the stop record rank 0's orphaned program wrote later."""
    stopped = RankEnd(1, -15, 10.0, True)
    assert first_own_end([stopped], 2) == RankEnd(0, -9, 10.0, False)
    assert first_own_end([stopped], None) is None  # the world size unknown: no rank is known to be missing
    assert first_own_end([], 1) is None  # no record at all (the whole session killed): nothing names a rank
    assert first_own_end([stopped], 3) is None  # two ranks without a record: which one began it is unknown
    assert first_own_end([RankEnd(1, 0, 10.0, False)], 2) is None  # a peer that ended on its own, cleanly


def test_a_stop_that_reached_a_ranks_parent_before_its_program_started_reaches_the_program(tmp_path):
    """torchrun's SIGTERM came before the parent started the program (it signals the process group, which the
    program had not joined yet): the program ran on until torchrun's SIGKILL at its shutdown timeout (60 s)."""
    import os
    import signal
    import subprocess
    import sys

    from orchkit import wait_for

    go = tmp_path / "go"
    env = {**os.environ, "RANK": "0", "ORCH_SUBMIT_TOKEN": TOKEN, "ORCH_PAUSE_AT": "rank_before_program",
           "ORCH_PAUSE_UNTIL": str(go), "ORCH_PAUSE_S": "60"}
    parent = subprocess.Popen([sys.executable, "-m", "orchestrator.jobside.rankend", "--dir", str(tmp_path), "--launch",
                               LAUNCH, "--", sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        wait_for(lambda: (tmp_path / "go.reached").exists(), 30, "the parent to reach the point before its program")
        parent.send_signal(signal.SIGTERM)
        go.touch()
        assert parent.wait(timeout=30) == -signal.SIGTERM  # ends as its program did: of the stop, not of a timeout
    finally:
        parent.kill()
    [end] = read_rank_ends(tmp_path, LAUNCH, TOKEN, 1)
    assert (end.returncode, end.stopped) == (-signal.SIGTERM, True)
