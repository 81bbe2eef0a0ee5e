"""classify(): (backend outcome, the job's own report, marker verification, orch's stop, the wrapper's
exit record) -> failure class.

Table-driven over every row of the decision: orch's own stop, the job's report, the scheduler's
cause, a stop the wrapper delivered, vanished, then the exit code. How Slurm's states become causes
(``PREEMPTED`` -> preempted, the OverMemoryKill line -> oom) is tested with the Slurm backend
(tests/unit/test_slurm_states.py): classify knows no scheduler's vocabulary.
"""

from __future__ import annotations

import signal

import pytest

from orchestrator.backends.base import Outcome, Phase
from orchestrator.backends.slurm.states import STATE_CAUSE
from orchestrator.decide.classify import classify
from orchestrator.decide.staleness import Stale
from orchestrator.protocol import (
    FAILURE_CLASSES,
    ExitRecord,
    FailureClass,
    FailureReport,
    MarkerStatus,
    StopRecord,
    Verification,
)

ABSENT = Verification(MarkerStatus.ABSENT, "no done.json")
CORRUPT = Verification(MarkerStatus.CORRUPT, "result/model.pt sha256 mismatch")


def exited(rc=None, sig=None, state=None, reason=""):
    """An outcome as a backend reports it: ``state`` is the scheduler's word, mapped to its cause the
    way the Slurm backend maps it."""
    cause = STATE_CAUSE.get(state.split()[0].upper()) if state else None
    return Outcome(Phase.EXITED, exit_code=rc, signal=sig, backend_state=state, reason=reason, cause=cause)


def stopped(rc, source="signal", sig="TERM"):
    """The wrapper's record of a program it delivered a stop to."""
    return ExitRecord(token="t", returncode=rc, stop_signal=sig, stop_source=source)


# (id, outcome, report, verification, preset, expected class, text the detail must contain)
ROWS = [
    # the job's own report wins over everything the scheduler says
    ("report wins over exit 1", exited(1), {"class": "nan", "step": 412, "detail": "loss nan"}, ABSENT, None,
     "nan", "loss nan"),
    ("report wins over slurm OOM", exited(0, state="OUT_OF_MEMORY"), {"class": "enospc", "step": 3}, ABSENT,
     None, "enospc", ""),
    ("report wins over exit 0 + corrupt", exited(0), {"class": "crash", "detail": "x"}, CORRUPT, None,
     "crash", "x"),
    ("report wins over vanished", Outcome(Phase.VANISHED), {"class": "oom", "step": 7}, ABSENT, None,
     "oom", ""),
    ("orch's own hang stop beats the job's 'preempted' report", exited(143, sig=None), {"class": "preempted"},
     ABSENT, "hang", "hang", "reconciler"),
    ("a specific report beats the hang preset", exited(3), {"class": "nan", "step": 7}, ABSENT, "hang",
     "nan", ""),
    ("scancel'd job that checkpointed is cancelled, not a free resume", exited(143, state="CANCELLED"),
     {"class": "preempted"}, ABSENT, None, "cancelled", ""),
    ("preempted report at a time limit is a timeout", exited(143, state="TIMEOUT"), {"class": "preempted"},
     ABSENT, None, "timeout", ""),
    # the reconciler's preset (it stopped a hung job)
    ("hang preset over SIGTERM", exited(None, sig=signal.SIGTERM), None, ABSENT, "hang", "hang", "reconciler"),
    # Slurm states
    ("slurm PREEMPTED", exited(0, state="PREEMPTED"), None, ABSENT, None, "preempted", "PREEMPTED"),
    ("slurm TIMEOUT", exited(1, state="TIMEOUT"), None, ABSENT, None, "timeout", "TIMEOUT"),
    ("slurm DEADLINE", exited(1, state="DEADLINE"), None, ABSENT, None, "timeout", "DEADLINE"),
    ("slurm OUT_OF_MEMORY", exited(0, state="OUT_OF_MEMORY"), None, ABSENT, None, "oom", "OUT_OF_MEMORY"),
    ("slurm NODE_FAIL", exited(1, state="NODE_FAIL"), None, ABSENT, None, "node_fail", "NODE_FAIL"),
    ("slurm BOOT_FAIL", exited(1, state="BOOT_FAIL"), None, ABSENT, None, "node_fail", "BOOT_FAIL"),
    ("slurm 'CANCELLED by 1000'", exited(0, state="CANCELLED by 1000"), None, ABSENT, None, "cancelled",
     "CANCELLED"),
    ("slurm lower-case state", exited(1, state="timeout"), None, ABSENT, None, "timeout", ""),
    ("slurm state beats exit 0", exited(0, state="NODE_FAIL"), None, CORRUPT, None, "node_fail", ""),
    # OverMemoryKill (no cgroups): FAILED 0:9 and a line in the output; the backend reports it as OOM
    ("OverMemoryKill reason", exited(0, sig=9, state="OUT_OF_MEMORY",
                                     reason="slurmstepd: error: Job 12 exceeded memory limit (9 > 8), being killed"),
     None, ABSENT, None, "oom", "exceeded memory limit"),
    # vanished
    ("vanished", Outcome(Phase.VANISHED, reason="process gone without an exit record"), None, ABSENT, None,
     "killed", "gone without an exit record (its wrapper was killed: kill -9"),
    ("vanished without a reason", Outcome(Phase.VANISHED), None, ABSENT, None, "killed", "vanished"),
    # exit codes
    ("exit 0 + ABSENT", exited(0), None, ABSENT, None, "marker_missing", "without a done marker"),
    ("exit 0 + ABSENT, wrapper's reason", exited(0, reason="--outputs ['r/*'] matched no file"), None, ABSENT,
     None, "marker_missing", "matched no file"),
    ("exit 0 + CORRUPT", exited(0), None, CORRUPT, None, "marker_corrupt", "sha256 mismatch"),
    ("SIGTERM", exited(None, sig=signal.SIGTERM), None, ABSENT, None, "preempted", "SIGTERM"),
    ("exit 143", exited(143), None, ABSENT, None, "preempted", "SIGTERM"),
    # a SIGKILL with no record is recoverable (auto-requeued with back-off), not a crash
    ("SIGKILL", exited(None, sig=signal.SIGKILL), None, ABSENT, None, "killed", "SIGKILL"),
    ("exit 137", exited(137), None, ABSENT, None, "killed", "SIGKILL"),
    ("exit 2 of any program is a crash", exited(2), None, ABSENT, None, "crash", "exit 2"),
    ("SIGSEGV", exited(None, sig=signal.SIGSEGV), None, ABSENT, None, "crash", f"signal {int(signal.SIGSEGV)}"),
    ("exit 1", exited(1), None, ABSENT, None, "crash", "exit 1"),
    ("exit 3 without a readable report", exited(3), None, ABSENT, None, "crash", "exit 3"),
    ("exit 127 (command not found)", exited(127), None, ABSENT, None, "crash", "exit 127"),
]


@pytest.mark.parametrize("outcome,report,verification,preset,cls,detail", [r[1:] for r in ROWS],
                         ids=[r[0] for r in ROWS])
def test_classify_row(outcome, report, verification, preset, cls, detail):
    c = classify(outcome, FailureReport.parse(report), verification, stop_reason=preset)
    assert c.cls == cls
    assert c.cls in FAILURE_CLASSES
    assert detail in c.detail


# Rows that need the wrapper's exit record or the program's conventions.
RECORD_ROWS = [
    # a program that exits 0 after SIGTERM is a preempted run, never a missing marker
    ("exit 0 after a delivered SIGTERM", exited(0), stopped(0), "preempted", "SIGTERM"),
    ("exit 1 after a delivered SIGTERM", exited(1), stopped(1), "preempted", "signal"),
    ("exit 0 after the time-limit warning", exited(0), stopped(0, "warning"), "timeout", "warning"),
    ("exit 0 after the local time limit", exited(0), stopped(0, "time_limit"), "timeout", "time_limit"),
    # no program is recognised from argv; an exit 2 without the program's own report is a crash
    ("exit 2 without a report is a crash", exited(2), None, "crash", "exit 2"),
    ("the scheduler's cause beats the wrapper's record", exited(0, state="CANCELLED"), stopped(0),
     "cancelled", "CANCELLED"),
    # the wrapper's memory cgroup counted an OOM kill: oom, not killed
    ("SIGKILL with the cgroup's OOM kill count", exited(None, sig=signal.SIGKILL),
     ExitRecord(token="t", returncode=-9, oom_kill=1), "oom", "OOM killer"),
    ("exit 1 after a worker was OOM-killed", exited(1), ExitRecord(token="t", returncode=1, oom_kill=2), "oom", "2"),
    ("SIGKILL with a cgroup that counted none", exited(None, sig=signal.SIGKILL),
     ExitRecord(token="t", returncode=-9, oom_kill=0), "killed", "SIGKILL"),
]


@pytest.mark.parametrize("outcome,record,cls,detail", [r[1:] for r in RECORD_ROWS],
                         ids=[r[0] for r in RECORD_ROWS])
def test_classify_with_the_wrappers_record(outcome, record, cls, detail):
    c = classify(outcome, None, ABSENT, exit_record=record)
    assert (c.cls, detail in c.detail) == (cls, True), c


def test_orch_cancel_is_cancelled_whatever_the_job_reports():
    c = classify(exited(143), FailureReport.parse({"class": "preempted", "step": 9}), ABSENT, stop_reason="cancel")
    assert (c.cls, c.step) == (FailureClass.CANCELLED, 9)


def test_a_preempted_report_after_the_wrappers_warning_is_a_timeout():
    c = classify(exited(143), FailureReport.parse({"class": "preempted", "step": 9}), ABSENT,
                 exit_record=stopped(143, "warning", "USR2"))
    assert c.cls is FailureClass.TIMEOUT


def test_report_step_is_carried_only_from_the_report():
    assert classify(exited(3), FailureReport.parse({"class": "nan", "step": 412}), ABSENT).step == 412
    assert classify(exited(1), None, ABSENT).step is None


def test_every_slurm_state_maps_to_a_contract_class():
    assert set(STATE_CAUSE.values()) <= set(FailureClass)


def test_every_row_class_is_produced_somewhere_by_the_table():
    # The table above covers every class classify can derive without a report ("invalid" comes only from
    # a program's own report or a refused launch: an exit code alone never proves it).
    derived = {r[5] for r in ROWS if r[2] is None} | {r[3] for r in RECORD_ROWS}
    assert derived == {"hang", "preempted", "timeout", "oom", "node_fail", "cancelled",
                       "marker_missing", "marker_corrupt", "crash", "killed"}


def test_a_hang_stop_names_the_rank_that_stopped_progressing():
    """The record of a hang stop says which rank stopped and where, from the typed record observe made
    when it began the stop (``Stale``: the attempt's stale_rank/stale_step/stale_age_s), never from parsing text;
    a one-process job's names no rank; without any record it reads as it always did."""
    c = classify(exited(None, sig=signal.SIGKILL), None, ABSENT, stop_reason="hang", hang=Stale(1, 95.4, 40))
    assert (c.cls, c.detail) == ("hang", "stopped by the reconciler: rank 1: no progress for 95 s at step 40")
    c = classify(exited(143), None, ABSENT, stop_reason="hang", hang=Stale(None, 612.0, 7))
    assert (c.cls, c.detail) == ("hang", "stopped by the reconciler: no heartbeat for 612 s at step 7")
    c = classify(exited(143), None, ABSENT, stop_reason="hang", hang=Stale(1, 700.0, None))
    assert c.detail == "stopped by the reconciler: rank 1: no progress for 700 s, before any step heartbeat"
    assert classify(exited(143), FailureReport.parse({"class": "preempted"}), ABSENT, stop_reason="hang").detail == \
        "stopped by the reconciler: no heartbeat"
    # Hostile pass: rank 1 SIGSTOPped mid-run; the hang stop killed it at once and rank 0's collective
    # lost its peer ("killed" in failure.json): the stop's consequence, still the hang.
    lost = FailureReport.parse({"class": "killed", "detail": "rank 0 lost a peer rank in a collective"})
    c = classify(exited(1), lost, ABSENT, stop_reason="hang", hang=Stale(1, 12.0, 120))
    assert (c.cls, c.detail) == ("hang", "stopped by the reconciler: rank 1: no progress for 12 s at step 120")
    assert classify(exited(1), lost, ABSENT).cls == "killed"  # without orch's stop it stays the kit's account


def test_a_rank_killed_on_its_own_is_killed_whatever_its_peers_recorded_after_it():
    """A kill -9 of rank 0 was `preempted`: torchrun then stopped rank 1, whose kit wrote stop.json and a
    preempted report. The rank whose own end came first was SIGKILLed, and no stop was delivered: killed."""
    rec = ExitRecord(token="t", returncode=1, failed_rank=0, rank_returncode=-9,
                     program_ended_at="2026-06-01T12:00:00.000+00:00")
    peer_stop = StopRecord("TERM", "2026-06-01T12:00:00.200+00:00", 41)
    peer_report = FailureReport.parse({"class": "preempted", "step": 41})
    c = classify(exited(1), peer_report, ABSENT, exit_record=rec, stop_record=peer_stop)
    assert c.cls is FailureClass.KILLED and c.detail.startswith("rank 0 killed by SIGKILL"), c
    # A stop delivered through the wrapper first (a preemption whose grace ran out): that stop's end, not a kill.
    stopped_first = ExitRecord(token="t", returncode=1, failed_rank=0, rank_returncode=-9, stop_signal="TERM")
    assert classify(exited(1), peer_report, ABSENT, exit_record=stopped_first).cls is FailureClass.PREEMPTED
    # The memory cgroup counted an OOM kill: oom.
    oom = ExitRecord(token="t", returncode=1, failed_rank=1, rank_returncode=-9, oom_kill=1)
    assert classify(exited(1), None, ABSENT, exit_record=oom).cls is FailureClass.OOM


def test_a_hang_stop_that_found_the_named_rank_killed_on_its_own_is_killed():
    """Hostile pass 4: rank 1 kill -9'd before its first heartbeat; rank 0, waiting for it, ignored
    torchrun's SIGTERM, and the reconciler stopped the attempt as 'rank 1: no progress': it was dead, not hung.
    The stop's SIGKILL took the wrapper before exit.json: the rank's own end comes from its parent's record."""
    c = classify(exited(None, sig=signal.SIGKILL), None, ABSENT, stop_reason="hang", hang=Stale(1, 23.0, None),
                 rank_end=(1, -9))
    assert c.cls is FailureClass.KILLED and c.detail.startswith("rank 1 killed by SIGKILL"), c
    # Another rank than the one the stop named: the hang stands (a peer's kill never hides a real hang).
    c = classify(exited(1), None, ABSENT, stop_reason="hang", hang=Stale(0, 23.0, 5), rank_end=(1, -9))
    assert c.cls is FailureClass.HANG, c
    # The named rank ended some other way (its own exit 1, or an OOM kill the cgroup counted): the hang stands.
    assert classify(exited(1), None, ABSENT, stop_reason="hang", hang=Stale(1, 23.0, None),
                    rank_end=(1, 1)).cls is FailureClass.HANG
    oom = ExitRecord(token="t", returncode=1, failed_rank=1, rank_returncode=-9, stop_signal="TERM", oom_kill=1)
    assert classify(exited(1), None, ABSENT, stop_reason="hang", hang=Stale(1, 23.0, None), exit_record=oom,
                    rank_end=(1, -9)).cls is FailureClass.HANG


def test_a_stop_record_written_after_the_program_ended_is_a_leftovers_and_tells_nothing():
    """The program (one process, kill -9'd) ended first; the wrapper then stopped what it left running, and that
    leftover's kit wrote stop.json: the program's end is its own SIGKILL, not a stop."""
    ended = "2026-06-01T12:00:00.000+00:00"
    rec = ExitRecord(token="t", returncode=None, signal=signal.SIGKILL, program_ended_at=ended)
    after = StopRecord("TERM", "2026-06-01T12:00:00.150+00:00", None)
    c = classify(exited(None, sig=signal.SIGKILL), None, ABSENT, exit_record=rec, stop_record=after)
    assert c.cls is FailureClass.KILLED, c
    before = StopRecord("TERM", "2026-06-01T11:59:59.900+00:00", 12)  # the program's own, before it ended
    c = classify(exited(None, sig=signal.SIGKILL), None, ABSENT, exit_record=rec, stop_record=before)
    assert (c.cls, c.step) == (FailureClass.PREEMPTED, 12), c
    unknown_end = ExitRecord(token="t", returncode=None, signal=signal.SIGKILL)  # an older wrapper's record
    assert classify(exited(None, sig=signal.SIGKILL), None, ABSENT, exit_record=unknown_end,
                    stop_record=after).cls is FailureClass.PREEMPTED


def test_garbage_at_stop_json_is_the_programs_own_failure_never_a_free_preemption():
    """Hostile pass: a program that wrote garbage (or a FIFO) at stop.json and exited 0 was `preempted`,
    requeued uncounted up to 100 times. read_stop takes garbage as a stop (never verified); classify counts it."""
    garbage = StopRecord(signal="unknown", at="", step=None)  # what read_stop returns for it
    c = classify(exited(0), None, ABSENT, stop_record=garbage)
    assert c.cls is FailureClass.CRASH and c.detail.startswith("stop.json is not a stop record"), c
    # A stop the wrapper delivered still wins; a well-formed record of an unknown signal is still a stop.
    rec = ExitRecord(token="t", returncode=143, stop_signal="TERM")
    assert classify(exited(143), None, ABSENT, exit_record=rec, stop_record=garbage).cls is FailureClass.PREEMPTED
    odd = StopRecord(signal="unknown", at="2026-06-01T12:00:00.000+00:00", step=3)
    assert classify(exited(143), None, ABSENT, stop_record=odd).cls is FailureClass.PREEMPTED


def test_a_preemption_recorded_by_leftovers_after_the_program_ended_is_not_the_attempts_end():
    """Hostile pass 5: torchrun kill -9'd, no stop delivered; the wrapper then stopped the orphaned ranks, whose kit
    wrote stop.json and a `preempted` report: the attempt read `preempted` (uncounted) for a kill."""
    rec = ExitRecord(token="t", returncode=-9, signal=signal.SIGKILL, program_ended_at="2026-06-01T12:00:00.000+00:00")
    leftover = StopRecord("TERM", "2026-06-01T12:00:00.300+00:00", 509)
    report = FailureReport.parse({"class": "preempted", "step": 509})
    c = classify(exited(None, sig=signal.SIGKILL), report, ABSENT, exit_record=rec, stop_record=leftover)
    assert c.cls is FailureClass.KILLED, c
    own = StopRecord("TERM", "2026-06-01T11:59:59.000+00:00", 509)  # the program's own stop, before its end
    assert classify(exited(None, sig=signal.SIGKILL), report, ABSENT, exit_record=rec,
                    stop_record=own).cls is FailureClass.PREEMPTED
    # A rank's orch parent kill -9'd: torchrun exit 1, the rank without a record named killed by the wrapper.
    parent = ExitRecord(token="t", returncode=1, failed_rank=0, rank_returncode=-9,
                        program_ended_at="2026-06-01T12:00:00.000+00:00")
    c = classify(exited(1), report, ABSENT, exit_record=parent, stop_record=leftover)
    assert c.cls is FailureClass.KILLED and c.detail.startswith("rank 0 killed by SIGKILL"), c


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_an_outside_interrupt_or_hangup_is_killed_and_requeued_not_a_crash(sig):
    """Hostile pass 5: kill -INT / kill -HUP of the program was `crash`, parked for `orch requeue`."""
    c = classify(exited(None, sig=sig), None, ABSENT)
    assert c.cls is FailureClass.KILLED and signal.Signals(sig).name in c.detail, c
    assert classify(exited(None, sig=signal.SIGSEGV), None, ABSENT).cls is FailureClass.CRASH  # the program's own
