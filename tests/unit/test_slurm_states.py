"""Slurm states -> phases, and the Slurm backend's composition of sacct + squeue, without a cluster.

The sacct/squeue lines below are the ones the dev cluster printed (Slurm 22.05.8, see
deploy/slurm/README.md); the same scenarios run for real in tests/slurm/. Here the scheduler is
faked at the subprocess boundary (``slurm._run``), which is what makes the timing windows
reproducible: e.g. the ~5 s after a preemption in which sacct already says PREEMPTED while the
controller is requeueing the job in place.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from orchestrator.backends.base import AttemptRef, Outcome, Phase, Resources, SubmitSpec
from orchestrator.backends.slurm import backend as slurm
from orchestrator.backends.slurm import states as st
from orchestrator.backends.slurm.output import slurm_output_path
from orchestrator.protocol import FailureClass


def rec(state: str, dbi: int = 1, code: str = "0:0", name: str = "orch-t1", job: str = "7") -> str:
    return f"{job}|{name}|{state}|{code}|{dbi}|None"


# ------------------------------------------------------------------------------------------
# pure mapping
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw,phase", [
    ("PENDING", Phase.PENDING), ("REQUEUED", Phase.PENDING), ("REQUEUE_HOLD", Phase.PENDING),
    ("RUNNING", Phase.RUNNING), ("COMPLETING", Phase.RUNNING), ("SUSPENDED", Phase.RUNNING),
    ("COMPLETED", Phase.EXITED), ("FAILED", Phase.EXITED), ("TIMEOUT", Phase.EXITED),
    ("OUT_OF_MEMORY", Phase.EXITED), ("NODE_FAIL", Phase.EXITED), ("CANCELLED by 0", Phase.EXITED),
    ("PREEMPTED", Phase.EXITED), ("BOOT_FAIL", Phase.EXITED), ("DEADLINE", Phase.EXITED),
    ("SOMETHING_NEW", Phase.UNKNOWN), ("", Phase.UNKNOWN),
])
def test_every_state_maps_to_a_phase_and_unknown_states_never_exit(raw: str, phase: Phase) -> None:
    assert st.phase_of(raw) is phase


def test_cancelled_by_uid_is_cancelled() -> None:
    assert st.normalize_state("CANCELLED by 0") == "CANCELLED"
    assert st.normalize_state("cancelled+") == "CANCELLED"


@pytest.mark.parametrize("field,expected", [
    ("0:0", (0, None)), ("3:0", (3, None)), ("0:9", (0, 9)), ("0:15", (0, 15)),
    # measured: a batch script that exits 143 shows as 15:0 in 22.05's sacct (137 as 9:0)
    ("15:0", (15, None)), ("", (None, None)), ("x:y", (None, None)),
])
def test_exit_code_field(field: str, expected: tuple) -> None:
    assert st.parse_exit_code(field) == expected


def test_newest_record_wins_by_dbindex_not_output_order() -> None:
    recs = st.parse_sacct("\n".join([rec("PENDING", dbi=4), rec("PREEMPTED", dbi=1)]))["7"]
    assert [r.state for r in recs] == ["PREEMPTED", "PENDING"]
    oc = st.outcome_from_records(recs)
    assert (oc.phase, oc.restart_count, oc.backend_state) == (Phase.PENDING, 1, "PENDING")


def test_requeued_in_place_rerun_is_running_never_exited() -> None:
    recs = st.parse_sacct("\n".join([rec("PREEMPTED", 1), rec("RUNNING", 4)]))["7"]
    oc = st.outcome_from_records(recs)
    assert oc.phase is Phase.RUNNING and oc.restart_count == 1


def test_a_resize_is_the_same_run_never_a_restart() -> None:
    """A node lost under --no-kill (a spare node's job, measured on 22.05): sacct lists RESIZING on the old node list,
    then the run on the new one. Slurm ran the job once: no restart, one run held from the first record's start."""
    lines = [rec("RESIZING", 1) + "|7|n[2-3],vm|1000|1030", rec("COMPLETED", 2) + "|7|n2,vm|1030|1090"]
    oc = st.outcome_from_records(st.parse_sacct("\n".join(lines))["7"])
    assert (oc.phase, oc.restart_count, oc.backend_state) == (Phase.EXITED, 0, "COMPLETED")
    assert oc.runs == ((1000.0, 1090.0),)
    live = st.outcome_from_records(st.parse_sacct(rec("RESIZING", 1) + "|7|n[2-3],vm|1000|Unknown")["7"])
    assert (live.phase, live.restart_count) == (Phase.RUNNING, 0)  # the newest record, still resizing: running
    again = [rec("PREEMPTED", 1) + "|7|n1|900|950", *lines]
    assert st.outcome_from_records(st.parse_sacct("\n".join(again))["7"]).restart_count == 1


def test_each_started_run_is_held_from_its_start_to_its_end_in_epoch_seconds() -> None:
    """sacct's Start and End, asked with SLURM_TIME_FORMAT=%s: a run preempted (1000 -> 1013), its rerun still
    running (1028 -> Unknown), a record that never started left out; an ISO time (sacct without the format) and
    garbage read too."""
    lines = [rec("PREEMPTED", 1) + "|7|n1|1000|1013", rec("RUNNING", 4) + "|7|n1|1028|Unknown",
             rec("PENDING", 6) + "|7|None assigned|Unknown|Unknown"]
    recs = st.parse_sacct("\n".join(lines))["7"]
    assert [(r.start, r.end) for r in recs] == [(1000.0, 1013.0), (1028.0, None), (None, None)]
    oc = st.outcome_from_records(recs)
    assert oc.runs == ((1000.0, 1013.0), (1028.0, None))
    assert st.parse_time("2026-12-07T01:43:36") == __import__("datetime").datetime(2026, 12, 7, 1, 43, 36).timestamp()
    for junk in ("Unknown", "None", "", "99999999999999999", "Tomorr 12:00", "2026-13-40T00:00:00"):
        assert st.parse_time(junk) is None, junk
    ended = st.outcome_from_records(st.parse_sacct(rec("PREEMPTED", 1) + "|7|n1|1000|990")["7"])
    assert ended.runs == ((1000.0, None),)  # an end before its start is no end
    # squeue lists the rerun before sacct has its record: the runs sacct accounted travel on
    live = st.combine(st.outcome_from_records(st.parse_sacct(lines[0])["7"]), ("orch-t1", "RUNNING", ""),
                      live_known=True)
    assert (live.phase, live.restart_count, live.runs) == (Phase.RUNNING, 1, ((1000.0, 1013.0),))


def test_failed_0_9_with_over_memory_line_is_out_of_memory() -> None:
    recs = st.parse_sacct(rec("FAILED", code="0:9"))["7"]
    line = "slurmstepd-vm: error: StepId=9.batch exceeded memory limit (643219456 > 104857600), being killed"
    oc = st.outcome_from_records(recs, over_memory_line=line)
    assert (oc.phase, oc.backend_state, oc.signal) == (Phase.EXITED, "OUT_OF_MEMORY", 9)
    assert "exceeded memory limit" in oc.reason
    assert st.outcome_from_records(recs).backend_state == "FAILED"


def test_steps_and_garbage_lines_are_ignored() -> None:
    text = "7.batch|batch|COMPLETED|0:0|1|None\nnot a record\n" + rec("COMPLETED")
    assert list(st.parse_sacct(text)) == ["7"]


# ------------------------------------------------------------------------------------------
# combine(): sacct's view + the controller's
# ------------------------------------------------------------------------------------------
PREEMPTED = Outcome(Phase.EXITED, exit_code=0, backend_state="PREEMPTED")


@pytest.mark.parametrize("live,phase,restarts", [
    (("orch-t1", "COMPLETING", "None"), Phase.RUNNING, 0),  # the preempted run is still being torn down
    (("orch-t1", "PENDING", "BeginTime"), Phase.PENDING, 1),  # requeued; sacct has no new record yet
    (("orch-t1", "RUNNING", "None"), Phase.RUNNING, 1),
    (("orch-t1", "PREEMPTED", "None"), Phase.EXITED, 0),  # PreemptMode=CANCEL: really over
    (None, Phase.EXITED, 0),  # the controller forgot it (MinJobAge): sacct's word is final
])
def test_controller_overrides_a_terminal_sacct_state_while_it_has_the_job(live, phase, restarts) -> None:
    oc = st.combine(PREEMPTED, live, live_known=True)
    assert (oc.phase, oc.restart_count) == (phase, restarts)


def test_preempted_without_the_controllers_word_is_unknown() -> None:
    assert st.combine(PREEMPTED, None, live_known=False).phase is Phase.UNKNOWN
    failed = Outcome(Phase.EXITED, exit_code=1, backend_state="FAILED")
    assert st.combine(failed, None, live_known=False) is failed  # a FAILED job is never requeued in place


def test_no_sacct_record_is_pending_if_the_controller_has_it_else_unknown() -> None:
    assert st.combine(None, ("orch-t1", "PENDING", "None"), live_known=True).phase is Phase.PENDING
    assert st.combine(None, None, live_known=True).phase is Phase.UNKNOWN
    # even a terminal controller state is not enough to call it exited without sacct's record
    assert st.combine(None, ("orch-t1", "COMPLETED", "None"), live_known=True).phase is Phase.UNKNOWN


# ------------------------------------------------------------------------------------------
# the backend, with sacct/squeue/sbatch faked at the subprocess boundary
# ------------------------------------------------------------------------------------------
class FakeSlurm:
    def __init__(self) -> None:
        self.answers: dict[str, subprocess.CompletedProcess | Exception] = {}
        self.calls: list[list[str]] = []

    def set(self, cmd: str, out: str = "", rc: int = 0, err: str = "") -> None:
        self.answers[cmd] = subprocess.CompletedProcess([cmd], rc, out, err)

    def __call__(self, argv: list[str], timeout_s: float, env: dict | None = None):
        self.calls.append(argv)
        # times as epoch seconds, whatever the caller's own SLURM_TIME_FORMAT
        if argv[0] == "sacct" and any("Start" in a for a in argv):
            assert env is not None and env["SLURM_TIME_FORMAT"] == "%s" and "PATH" in env, env
        a = self.answers.get(argv[0], subprocess.CompletedProcess(argv, 0, "", ""))
        if isinstance(a, Exception):
            raise a
        return a


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    f = FakeSlurm()
    monkeypatch.setattr(slurm, "_run", f)
    return f


def ref(tmp_path: Path, token: str = "t1", job_id: str = "7") -> AttemptRef:
    return AttemptRef(job_id, token, tmp_path / "run", 1)


def test_poll_is_one_sacct_call_and_no_squeue_while_everything_runs(fake: FakeSlurm, tmp_path: Path) -> None:
    fake.set("sacct", "\n".join([rec("RUNNING", job="7", name="orch-a"),
                                  rec("PENDING", job="8", name="orch-b")]))
    out = slurm.SlurmBackend().poll([ref(tmp_path, "a", "7"), ref(tmp_path, "b", "8")])
    assert (out["a"].phase, out["b"].phase) == (Phase.RUNNING, Phase.PENDING)
    assert [c[0] for c in fake.calls] == ["sacct"]
    assert "--duplicates" in fake.calls[0] and "-j" in fake.calls[0] and "7,8" in fake.calls[0]


def test_poll_in_the_requeue_window_says_pending_not_exited(fake: FakeSlurm, tmp_path: Path) -> None:
    fake.set("sacct", rec("PREEMPTED"))
    fake.set("squeue", "7|orch-t1|PENDING|BeginTime")
    oc = slurm.SlurmBackend().poll([ref(tmp_path)])["t1"]
    assert (oc.phase, oc.restart_count) == (Phase.PENDING, 1)


@pytest.mark.parametrize("failure", [
    dict(out="", rc=1, err="sacct: error: Problem talking to the database: Connection refused"),
    subprocess.TimeoutExpired(["sacct"], 30), FileNotFoundError("sacct"),
])
def test_sacct_failing_gives_unknown_for_all_never_exited(fake: FakeSlurm, tmp_path: Path, failure) -> None:
    if isinstance(failure, Exception):
        fake.answers["sacct"] = failure
    else:
        fake.set("sacct", **failure)
    out = slurm.SlurmBackend().poll([ref(tmp_path, "a", "7"), ref(tmp_path, "b", "8")])
    assert {k: v.phase for k, v in out.items()} == {"a": Phase.UNKNOWN, "b": Phase.UNKNOWN}
    assert "sacct failed" in out["a"].reason


def test_a_reused_job_id_of_another_job_is_not_our_outcome(fake: FakeSlurm, tmp_path: Path) -> None:
    fake.set("sacct", rec("COMPLETED", name="someone-else"))
    fake.set("squeue", "7|orch-t1|PENDING|Priority")
    assert slurm.SlurmBackend().poll([ref(tmp_path)])["t1"].phase is Phase.PENDING


def test_just_submitted_unknown_to_sacct_pending_if_squeue_knows_it(fake: FakeSlurm, tmp_path: Path) -> None:
    fake.set("sacct", "")
    fake.set("squeue", "7|orch-t1|PENDING|None")
    assert slurm.SlurmBackend().poll([ref(tmp_path)])["t1"].phase is Phase.PENDING
    fake.set("squeue", "", rc=1, err="slurm_load_jobs error: Invalid job id specified")
    assert slurm.SlurmBackend().poll([ref(tmp_path)])["t1"].phase is Phase.UNKNOWN


def test_over_memory_kill_form_is_reported_as_out_of_memory(fake: FakeSlurm, tmp_path: Path) -> None:
    r = ref(tmp_path)
    out = slurm_output_path(r, "7")
    out.parent.mkdir(parents=True)
    out.write_text("slurmstepd-vm: error: StepId=7.batch exceeded memory limit (643219456 > 104857600), "
                   "being killed\nslurmstepd-vm: error: Exceeded job memory limit\n"
                   "slurmstepd-vm: error: *** JOB 7 ON vm CANCELLED AT 2026-11-29T15:56:33 ***\n")
    fake.set("sacct", rec("FAILED", code="0:9"))
    fake.set("squeue", "7|orch-t1|FAILED|OutOfMemory")
    oc = slurm.SlurmBackend().poll([r])["t1"]
    assert (oc.phase, oc.backend_state, oc.signal) == (Phase.EXITED, "OUT_OF_MEMORY", 9)
    assert "exceeded memory limit" in oc.reason.lower()


# ------------------------------------------------------------------------------------------
# submission: only validated values reach sbatch; the command never passes through a shell
# ------------------------------------------------------------------------------------------
def spec(tmp_path: Path, **kw) -> SubmitSpec:
    base = dict(job="train-1", attempt=1, token="abc123", run_dir=tmp_path / "runs" / "train-1",
                command=("python", "-c", "print(1)"), env={"ORCH_OVERRIDES": "{}"},
                resources=Resources(gpus=1, cpus_per_task=2, mem_mb=500, time_s=90, extras={"partition": "spot"}))
    base.update(kw)
    return SubmitSpec(**base)


def test_sbatch_argv_has_requeue_append_signal_and_resources(tmp_path: Path) -> None:
    s = spec(tmp_path)
    argv = slurm.SlurmBackend().sbatch_argv(s, s.attempt_dir / "slurm" / "job.sbatch")
    for want in ("--requeue", "--open-mode=append", "--job-name=orch-abc123", "--partition=spot",
                 "--gres=gpu:1", "--cpus-per-task=2", "--mem=500M", "--time=2", "--signal=B:USR2@10",
                 "--export=ALL"):
        assert want in argv
    assert not any(a.startswith("--wrap") for a in argv)


@pytest.mark.parametrize("bad", [
    dict(resources=Resources(extras={"partition": "spot\n#SBATCH --account=other"})),
    dict(resources=Resources(extras={"account": "a b"})),
    dict(resources=Resources(extras={"extra_sbatch": ("--qos=high\n#SBATCH --exclusive",)})),
    dict(resources=Resources(extras={"extra_sbatch": ("--output=/tmp/x",)})),
    dict(resources=Resources(extras={"extra_sbatch": ("--no-requeue",)})),
    dict(resources=Resources(extras={"extra_sbatch": ("--outp=/tmp/x",)})),  # getopt_long prefix of --output
    dict(resources=Resources(extras={"extra_sbatch": ("--Job-Name=x",)})),
    dict(resources=Resources(extras={"extra_sbatch": ("-p spot",)})),
    dict(resources=Resources(mem_mb=0)),
    dict(token="t\n#SBATCH"),
    dict(run_dir=Path("relative/run")),
    dict(run_dir=Path("/tmp/run%j")),
])
def test_values_that_could_smuggle_directives_are_refused(tmp_path: Path, bad: dict) -> None:
    s = spec(tmp_path, **bad)
    with pytest.raises(slurm.SlurmSubmitRefused):
        slurm.SlurmBackend().sbatch_argv(s, tmp_path / "job.sbatch")


def test_ordinary_extra_arguments_pass(tmp_path: Path) -> None:
    s = spec(tmp_path, resources=Resources(extras={"extra_sbatch": ("--qos=high", "--constraint=a100", "--exclusive")}))
    argv = slurm.SlurmBackend().sbatch_argv(s, tmp_path / "job.sbatch")
    assert argv[-4:-1] == ["--qos=high", "--constraint=a100", "--exclusive"]


def test_submit_refuses_before_writing_anything(tmp_path: Path, fake: FakeSlurm) -> None:
    s = spec(tmp_path, resources=Resources(extras={"partition": "bad\nname"}))
    with pytest.raises(slurm.SlurmSubmitRefused):
        slurm.SlurmBackend().submit(s)
    assert not s.run_dir.exists() and fake.calls == []


@pytest.mark.parametrize("time_s,lead", [(60, 10), (90, 10), (600, 60), (3600, 300), (86400, 300),
                                         (None, 180), (30, 5)])
def test_warning_lead_leaves_time_to_checkpoint_but_never_fires_at_start(time_s, lead) -> None:
    assert slurm.warning_lead_s(time_s) == lead


def test_batch_script_keeps_hostile_argv_and_env_inside_strings(tmp_path: Path) -> None:
    argv = ["/bin/echo", "x\n#SBATCH --partition=prio", "$(rm -rf ~)", "'\"", "é"]
    env = {"ORCH_OVERRIDES": '{"a": "b\\n#SBATCH"}', "X": "line1\nline2"}
    text = slurm.batch_script("/usr/bin/python3", argv, env, "orch job j attempt 1 token t")
    assert not any(line.startswith("#SBATCH") for line in text.splitlines())
    ns: dict = {}
    body = text.split("os.environ.update", 1)[0]  # the literals, without the exec
    exec(compile(body, "job.sbatch", "exec"), ns)  # our own generated text
    assert ns["ARGV"] == argv and ns["ENV"] == env


def test_submit_writes_the_script_and_passes_a_clean_environment(tmp_path: Path, fake: FakeSlurm,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    monkeypatch.setenv("SBATCH_PARTITION", "prio")
    monkeypatch.setenv("RANK", "3")
    envs: list = []

    def run(argv, timeout_s, env=None):
        envs.append(env)
        return subprocess.CompletedProcess(argv, 0, "4242\n", "")

    monkeypatch.setattr(slurm, "_run", run)
    s = spec(tmp_path)
    assert slurm.SlurmBackend().submit(s) == "4242"
    assert not {"SLURM_JOB_ID", "SBATCH_PARTITION", "RANK"} & set(envs[0])
    script = (s.attempt_dir / "slurm" / "job.sbatch").read_text()
    assert script.startswith("#!/") and "orchestrator.jobside.wrapper" in script
    rec_ = json.loads((s.attempt_dir / "slurm" / "submitted.json").read_text())
    assert rec_["job_id"] == "4242" and rec_["token"] == "abc123"


def test_find_by_token_uses_the_job_name(fake: FakeSlurm, tmp_path: Path) -> None:
    fake.set("sacct", "12|orch-a\n15|orch-a\n")
    fake.set("squeue", "20|orch-b\n")
    found = slurm.SlurmBackend().find_by_token([ref(tmp_path, "a", None), ref(tmp_path, "b", None),
                                                ref(tmp_path, "c", None)])
    assert found == {"a": "12", "b": "20"}
    assert any(a.startswith("--name=orch-a,orch-b,orch-c") for a in fake.calls[0])


# ------------------------------------------------------------------------------------------
# a restart is counted only when Slurm restarted the task
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("live", [("orch-t1", "RUNNING", "None"), ("orch-t1", "PENDING", "Priority")])
def test_a_task_sacct_has_completed_is_no_restart_while_the_controller_still_lists_it(live) -> None:
    # A sweep task finishing as a prio job arrived: sacct COMPLETED, squeue still listing it for a moment.
    completed = st.outcome_from_records(st.parse_sacct(rec("COMPLETED", code="0:0"))["7"])
    assert st.combine(completed, live, live_known=True).restart_count == 0


def test_poll_of_a_completed_task_still_in_squeue_counts_no_restart(fake: FakeSlurm, tmp_path: Path) -> None:
    fake.set("sacct", rec("COMPLETED", job="7_3", name="orch-t1"))
    fake.set("squeue", "7_3|orch-t1|RUNNING|None")
    oc = slurm.SlurmBackend().poll([ref(tmp_path, "t1", "7_3")])["t1"]
    assert oc.restart_count == 0


def test_the_end_of_an_attempt_counts_restarts_from_sacct_and_the_wrappers_record_only(tmp_path: Path) -> None:
    from orchestrator import protocol
    from orchestrator.ops.attemptend import Evidence, _restarts_at_end

    absent = protocol.Verification(protocol.MarkerStatus.ABSENT, "no done.json")
    done = Outcome(Phase.EXITED, exit_code=0, backend_state="COMPLETED", restart_count=0)
    ev = Evidence(absent, None, done, protocol.ExitRecord(token="t1", returncode=0, restart_count=0))
    assert _restarts_at_end(1, ev) == 0  # the 1 was counted in the requeue window: no run proves it
    rerun = protocol.ExitRecord(token="t1", returncode=0, restart_count=2)  # SLURM_RESTART_COUNT=2 seen by the job
    assert _restarts_at_end(0, Evidence(absent, None, done, rerun)) == 2
    requeued = Outcome(Phase.EXITED, exit_code=0, backend_state="COMPLETED", restart_count=1)  # 2 sacct records
    assert _restarts_at_end(0, Evidence(absent, None, requeued, None)) == 1


# ------------------------------------------------------------------------------------------
# the scheduler's cause of each in-place restart (sacct --duplicates, one record per run)
# ------------------------------------------------------------------------------------------
# Printed by the dev cluster (tests/slurm/test_node_fail_and_oom.py): a node set down under a --requeue job, rerun
# in place under the same id once the node was back. Fields: SACCT_FIELDS.
NODE_FAIL_RERUN = ("332|orch-41f31ab96daa8bcd|NODE_FAIL|0:0|611|None|332|vm\n"
                   "332|orch-41f31ab96daa8bcd|COMPLETED|0:0|613|BeginTime|332|vm\n")
PREEMPTED_RERUN = ("11|orch-t1|PREEMPTED|0:0|19|None|11|vm\n"
                   "11|orch-t1|RUNNING|0:0|23|None|11|vm\n")


def test_a_node_fail_rerun_in_place_has_the_cause_node_fail() -> None:
    oc = st.outcome_from_records(st.parse_sacct(NODE_FAIL_RERUN)["332"])
    assert (oc.phase, oc.restart_count, oc.restart_causes) == (Phase.EXITED, 1, (FailureClass.NODE_FAIL,))


def test_a_preempted_rerun_in_place_has_the_cause_preempted() -> None:
    oc = st.outcome_from_records(st.parse_sacct(PREEMPTED_RERUN)["11"])
    assert (oc.phase, oc.restart_count, oc.restart_causes) == (Phase.RUNNING, 1, (FailureClass.PREEMPTED,))


def test_an_earlier_run_in_a_state_slurm_does_not_requeue_from_has_no_cause() -> None:
    # A user's `scontrol requeue` (REQUEUED) or a state orch does not know: the run's own records decide.
    recs = st.parse_sacct("\n".join([rec("REQUEUED", 1), rec("SOMETHING_NEW", 2), rec("RUNNING", 3)]))["7"]
    assert st.outcome_from_records(recs).restart_causes == (None, None)


def test_in_the_requeue_window_the_newest_record_is_the_earlier_runs_cause() -> None:
    # sacct still says NODE_FAIL as newest while squeue has the rerun pending: restarts+1, and that run's cause.
    nf = st.outcome_from_records(st.parse_sacct(rec("NODE_FAIL"))["7"])
    oc = st.combine(nf, ("orch-t1", "PENDING", "BeginTime"), live_known=True)
    assert (oc.restart_count, oc.restart_causes) == (1, (FailureClass.NODE_FAIL,))


def test_poll_carries_each_runs_cause_and_sacct_failing_carries_none(fake: FakeSlurm, tmp_path: Path) -> None:
    fake.set("sacct", rec("NODE_FAIL", 1) + "\n" + rec("PREEMPTED", 2) + "\n" + rec("RUNNING", 3))
    oc = slurm.SlurmBackend().poll([ref(tmp_path)])["t1"]
    assert oc.restart_causes == (FailureClass.NODE_FAIL, FailureClass.PREEMPTED)
    fake.set("sacct", "", rc=1, err="slurmdbd down")
    assert slurm.SlurmBackend().poll([ref(tmp_path)])["t1"].restart_causes == ()  # unknown, never a guess


def test_reconcile_records_the_schedulers_causes_where_show_reads_them(tmp_path: Path) -> None:
    from orchestrator import protocol
    from orchestrator.ops.attemptpoll import _record_restart_causes

    r = ref(tmp_path)
    oc = Outcome(Phase.RUNNING, restart_count=2, restart_causes=(FailureClass.NODE_FAIL, None))
    _record_restart_causes(r, oc)
    assert protocol.read_restart_causes(r.attempt_dir, "t1") == ["node_fail", None]
