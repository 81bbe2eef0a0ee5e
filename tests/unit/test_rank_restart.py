"""Restarts of the ranks inside the allocation (``--rank-restarts``): when the wrapper tries one, when it must not,
and the record it leaves (job-writable, so read back field by field)."""

from __future__ import annotations

import json
import signal

import pytest

from orchestrator import protocol
from orchestrator.jobside import rankrestart
from orchestrator.jobside.rankend import RankEnd

KILLED = RankEnd(1, -signal.SIGKILL, 10.0, False)


def failed(**kw: object) -> rankrestart.Failed:
    base = dict(returncode=1, stopped=False, completed=False, oom_kills=0, end=KILLED, report_class=None)
    return rankrestart.Failed(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("end_signal", [signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS])
def test_a_rank_killed_by_a_signal_no_peer_sends_is_transient(end_signal):
    assert rankrestart.transient_cause(failed(end=RankEnd(1, -end_signal, 1.0, False))) == "killed"


@pytest.mark.parametrize("kw,why", [
    (dict(returncode=0), "the ranks succeeded"),
    (dict(stopped=True), "a stop (preemption, cancel, time limit) ends the attempt"),
    (dict(completed=True), "training completed"),
    (dict(oom_kills=1), "an OOM repeats at the same batch size"),
    (dict(end=RankEnd(1, 1, 1.0, False)), "a rank that raised: a bug repeats"),
    (dict(end=RankEnd(0, -signal.SIGABRT, 1.0, False)), "an abort is what a lost peer does"),
    (dict(end=None), "no rank's end tells"),
    (dict(report_class="nan"), "the program's NaN"),
    (dict(report_class="oom"), "the program's OOM"),
    (dict(report_class="crash"), "the program's crash"),
    (dict(report_class="invalid"), "the program's invalid input"),
])
def test_what_is_never_restarted_in_the_allocation(kw, why):
    assert rankrestart.transient_cause(failed(**kw)) is None, why


def test_the_programs_report_of_a_storage_fault_is_transient_whatever_the_exit():
    assert rankrestart.transient_cause(failed(end=RankEnd(0, 1, 1.0, False), report_class="storage")) == "storage"


def test_the_cap_and_the_no_progress_guard():
    assert rankrestart.refusal("killed", 0, 0, 40, None) == "not asked for (--rank-restarts 0)"
    assert rankrestart.refusal(None, 0, 2, 40, None) == "not a transient failure"
    assert rankrestart.refusal("killed", 0, 2, None, None) is None  # the first: even before any commit
    assert rankrestart.refusal("killed", 1, 2, 60, 40) is None  # a newer commit since the last restart
    assert "no checkpoint newer than step 40" in rankrestart.refusal("killed", 1, 2, 40, 40)
    assert "no checkpoint newer than step 0" in rankrestart.refusal("killed", 1, 2, None, None)
    assert "the 2 rank restart(s) asked for were made" in rankrestart.refusal("killed", 2, 2, 80, 60)


def test_record_keeps_the_failed_runs_report_aside_and_appends(tmp_path):
    adir = tmp_path / "attempts" / "1"
    adir.mkdir(parents=True)
    (adir / protocol.FAILURE_FILE).write_text(json.dumps({"class": "killed", "step": 47, "detail": "lost a peer"}))
    (adir / "failure.rank-00001.json").write_text(json.dumps({"class": "crash", "step": 47, "rank": 1}))
    (adir / protocol.STOP_FILE).write_text("{}")
    assert rankrestart.record(adir, "tok", failed(), "killed", 47, 40, 100.0) == 1
    # the next launch's reports are its own: a survivor read a peer's old failure record as its cause
    assert not list(adir.glob("failure*")) and not (adir / protocol.STOP_FILE).exists()
    aside = adir / "rank-restarts" / "1"
    assert sorted(p.name for p in aside.iterdir()) == ["failure.json", "failure.rank-00001.json", "stop.json"]
    assert json.loads((aside / "failure.json").read_text())["step"] == 47
    assert rankrestart.record(adir, "tok", failed(end=None), "storage", None, 60, 200.0) == 2
    got = protocol.read_rank_restarts(adir, "tok")
    assert got == [
        {"at": 100.0, "failed_rank": 1, "rank_returncode": -9, "class": "killed", "failed_step": 47, "resume_step": 40,
         "lost_nodes": []},
        {"at": 200.0, "failed_rank": None, "rank_returncode": None, "class": "storage", "failed_step": None,
         "resume_step": 60, "lost_nodes": []}]
    assert protocol.read_rank_restarts(adir, "another-token") == []


@pytest.mark.parametrize("content", [
    "not json", "[]", '{"token": "tok"}', '{"token": "tok", "restarts": 3}',
])
def test_a_malformed_record_reads_as_none(tmp_path, content):
    (tmp_path / protocol.RANK_RESTARTS_FILE).write_text(content)
    assert protocol.read_rank_restarts(tmp_path, "tok") == []


def test_each_field_of_a_hostile_record_is_checked(tmp_path):
    (tmp_path / protocol.RANK_RESTARTS_FILE).write_text(json.dumps({"token": "tok", "restarts": [
        "x", {"at": "soon", "failed_rank": -1, "rank_returncode": 10**9, "class": "meteor", "failed_step": 1.5,
              "resume_step": True, "lost_nodes": ["n3", "--exclude=x", 7, "n2;rm"]}]}))
    assert protocol.read_rank_restarts(tmp_path, "tok") == [
        {"at": None, "failed_rank": None, "rank_returncode": None, "class": "unknown", "failed_step": None,
         "resume_step": None, "lost_nodes": ["n3"]}]  # only node names reach srun's --nodelist


def test_a_stop_recorded_after_the_first_rank_died_is_torchruns_teardown_not_the_attempts():
    end = RankEnd(1, -signal.SIGKILL, 1_000.0, False)  # epoch seconds
    assert rankrestart.stopped_by_its_end("1970-01-01T00:16:40.030+00:00", end)  # 30 ms after: torchrun's SIGTERM
    assert not rankrestart.stopped_by_its_end("1970-01-01T00:16:39.000+00:00", end)  # before: a real stop
    assert not rankrestart.stopped_by_its_end("garbage", end)
    assert not rankrestart.stopped_by_its_end("1970-01-01T00:16:41+00:00", None)  # no end to blame


def test_the_relaunch_resumes_from_the_newest_commit_not_the_attempts_rollback_target(tmp_path, monkeypatch):
    monkeypatch.setattr(rankrestart.protocol, "expected_resume_step",
                        lambda _rd, _n, overrides: 20 if "resume" in overrides else 60)
    env = {protocol.ENV_OVERRIDES: json.dumps({"resume": "/runs/j/checkpoints/step-20", "batch_size": 8}),
           protocol.ENV_RESUME_STEP: "20"}
    rankrestart.resume_env(tmp_path, 2, env)
    assert json.loads(env[protocol.ENV_OVERRIDES]) == {"batch_size": 8}  # the policy's other overrides stay
    assert env[protocol.ENV_RESUME_STEP] == "60"


def test_a_rank_restarts_dir_planted_as_a_symlink_is_never_written_through(tmp_path):
    adir = tmp_path / "attempts" / "1"
    adir.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (adir / "rank-restarts").symlink_to(outside)
    (adir / protocol.FAILURE_FILE).write_text(json.dumps({"class": "killed", "step": 3}))
    assert rankrestart.record(adir, "tok", failed(), "killed", 3, 0, 1.0) == 1
    assert list(outside.iterdir()) == []  # nothing moved out of the run dir
    assert not (adir / protocol.FAILURE_FILE).exists()  # and the next launch never reads it as its own


def test_a_node_lost_under_the_ranks_is_node_fail_whatever_the_survivors_reported():
    lost = failed(end=RankEnd(0, 1, 1.0, False), report_class="killed", lost_nodes=("n3",))
    assert rankrestart.transient_cause(lost) == "node_fail"
    assert rankrestart.transient_cause(failed(stopped=True, lost_nodes=("n3",))) is None  # a stop still ends it
    # a stop only the program recorded, with a node lost: the survivors' torchrun agents lost the rendezvous store
    # with the node and SIGTERMed their ranks (the --min-nodes test on the dev cluster); without a lost node it ends it
    assert rankrestart.transient_cause(failed(program_stopped=True, lost_nodes=("n3",))) == "node_fail"
    assert rankrestart.transient_cause(failed(program_stopped=True, end=RankEnd(1, -9, 1.0, False))) is None
