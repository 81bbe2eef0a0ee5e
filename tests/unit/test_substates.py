"""Sub-states are typed: stop reasons and sources, retry actions, held notes, launch and requeue
outcomes, a pass's changes, the policy's class sets, failure.json's record. Each keeps the exact strings
already stored in DBs and run dirs."""

from __future__ import annotations

from orchestrator.core import config
from orchestrator.protocol import FailureClass, Fault

C = FailureClass


def test_the_policy_defaults_read_from_the_class_traits_are_the_documented_sets():
    # The sets config.py spelled out before the traits existed (README's policy table).
    # Storage was added later: auto, never counted (a platform fault), cap 10.
    assert config.AUTO_REQUEUE == {"preempted", "timeout", "node_fail", "oom", "hang", "nan", "enospc",
                                   "input_missing", "killed", "storage"}
    assert config.UNCOUNTED == {"preempted", "timeout", "node_fail", "input_missing", "storage"}
    assert config.CLASS_CAPS == {"oom": 3, "nan": 3, "enospc": 2, "hang": 3, "crash": 3, "killed": 3,
                                 "preempted": 100, "timeout": 50, "node_fail": 20, "storage": 10}
    assert config.NEVER_COUNTED == {"preempted", "node_fail", "storage"}
    assert {c for c in C if c.fault is Fault.RUN} == {C.TIMEOUT, C.CRASH, C.HANG, C.OOM, C.KILLED}
    assert all(isinstance(c, FailureClass) for c in (*config.AUTO_REQUEUE, *config.UNCOUNTED, *config.CLASS_CAPS))


def test_orch_toml_policy_classes_load_as_failure_classes(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "orch.toml").write_text('[policy]\nauto_requeue = ["crash"]\nuncounted = ["oom"]\n[policy.caps]\nnan = 1\n')
    cfg = config.load_config(home)
    assert cfg.auto_requeue == frozenset({C.CRASH}) and cfg.uncounted == frozenset({C.OOM})
    assert all(isinstance(c, FailureClass) for c in (*cfg.auto_requeue, *cfg.uncounted, *cfg.caps))
    assert cfg.caps[C.NAN] == 1


def test_a_pass_reports_typed_changes_and_its_json_keeps_the_old_keys():
    from orchestrator.core.lifecycle import AttemptState, JobState
    from orchestrator.core.passchanges import Change, PassReport
    from orchestrator.core.retryplan import Action

    rep = PassReport()
    rep.changed += [Change("a", JobState.RETRYABLE_FAILED, cls=C.OOM, action=Action.MORE_MEMORY),
                    Change("b", AttemptState.STOPPING, why="hang")]
    assert rep.as_dict()["changed"] == [
        {"name": "a", "to": "retryable_failed", "class": "oom", "action": "more_memory"},
        {"name": "b", "to": "stopping", "why": "hang"}]
    import json
    assert json.loads(json.dumps(rep.as_dict()))["changed"][0]["to"] == "retryable_failed"


def test_launch_and_requeue_outcomes_are_enums_with_the_printed_words():
    from orchestrator.ops.launch import LaunchOutcome
    from orchestrator.ops.requeue import RequeueOutcome

    assert {o.value for o in LaunchOutcome} == {"submitted", "adopted", "lost_claim", "verified", "stopped"}
    assert {o.value for o in RequeueOutcome} == {"requeued", "would_requeue", "refused", "skipped", "error"}


def test_stop_sources_and_failure_reports_parse_into_types(tmp_path):
    import json

    from orchestrator import protocol
    from orchestrator.protocol import FailureReport, StopSource

    d = tmp_path / "attempts" / "1"
    d.mkdir(parents=True)
    for raw, want in (("warning", StopSource.WARNING), ("spot_notice", StopSource.SPOT_NOTICE), ("bogus", None),
                      (["x"], None)):
        (d / protocol.EXIT_FILE).write_text(json.dumps({"token": "t", "returncode": 143, "stop_source": raw}))
        assert protocol.read_exit(d, "t").stop_source is want
    (d / protocol.FAILURE_FILE).write_text(json.dumps({"class": "nan", "step": 10**30, "detail": "x\x00", "lr": 0.5}))
    rep = protocol.read_failure_report(tmp_path, 1)
    assert rep == FailureReport(C.NAN, None, "x\\x00", 0.5)
    assert protocol.read_failure(tmp_path, 1)["step"] is None  # the dict view agrees with the one parse
    assert FailureReport.parse({"class": "reboot"}) is None and FailureReport.parse([1]) is None


def test_a_plan_without_an_action_or_with_an_unknown_one_is_refused_not_resumed():
    import pytest

    from orchestrator.core.retryplan import Action, RetryPlan

    # from_dict used to turn a missing action into "resume": a damaged plan silently became a retry.
    with pytest.raises(ValueError, match="without an action"):
        RetryPlan.from_dict({"why": "x"})
    with pytest.raises(ValueError, match="unknown action"):
        RetryPlan.from_dict({"action": "reboot"})
    plan = RetryPlan.from_dict({"action": "give_up"})
    assert plan.action is Action.GIVE_UP and not plan.action.retries
    assert RetryPlan.from_dict(RetryPlan.make("rollback").as_dict()).action is Action.ROLLBACK
    assert [a for a in Action if a.retries] == [Action.RESUME, Action.ROLLBACK, Action.MORE_MEMORY,
                                                Action.PRUNE_AND_RESUME]


def test_a_held_note_has_one_typed_home_and_is_written_once_per_reason(db):
    from sqlalchemy import func, select

    from orchestrator.core.jobqueries import get_job
    from orchestrator.core.lifecycle import JobState, Note, create_job, held_reason, note_held
    from orchestrator.core.models import Event
    from orchestrator.views.show import _held

    with db.write() as s:
        create_job(s, JobState.PENDING, name="j", backend="local", run_dir="/nowhere/j", command=["true"])
    with db.write() as s:
        job = get_job(s, "j")
        from orchestrator.core.lifecycle import move_job
        move_job(s, job, JobState.CANCELLED, "orch cancel")
        note_held(s, job, "live process(es) still run in /x: 12; stop them first")
        note_held(s, job, "live process(es) still run in /x: 12; stop them first")  # the next pass: no new row
    with db.read() as s:
        job = get_job(s, "j")
        assert _held(s, job) == Note.HELD + "live process(es) still run in /x: 12; stop them first"
        assert s.scalar(select(func.count()).select_from(Event).where(Event.from_state == Event.to_state)) == 1
    # An attempt's event never reads as the job's note, whatever its text.
    assert held_reason(Event(job_id=1, attempt_id=3, from_state="x", to_state="x", reason=Note.HELD + "y")) is None
    assert held_reason(Event(job_id=1, from_state="x", to_state="x", reason=Note.HELD + "y")) == "next attempt held: y"
