"""Why did an attempt end without a verified marker?  (evidence) -> ``FailureClass``.

Evidence, strongest first:
1. a stop orch itself began (a hang stop, ``orch cancel``): orch knows why it sent the SIGTERM;
2. the job's own report (``attempts/<n>/failure.json``): the trainer knows it hit NaN at step 412;
3. the scheduler's cause (``Outcome.cause``: Slurm's PREEMPTED, OUT_OF_MEMORY, ... mapped to a class
   inside the Slurm backend; this module knows no scheduler's vocabulary);
4. the wrapper's record of a stop it delivered (``exit.json``): an attempt that was sent SIGTERM or
   the time-limit warning was stopped, whatever its exit code — exit 0 after SIGTERM is a preempted
   run, never a finished one;
5. the program's own record of a stop signal it received (``stop.json``, written by orch's kit): a
   SIGTERM that never passed through the wrapper (a user's kill, a container stop, a VM shutdown) is
   a stop too, whatever the exit code and whoever sent it;
6. the exit status (a bare SIGKILL is ``killed``; the wrapper's memory cgroup count of OOM kills makes it
   ``oom``, see orchestrator/jobside/memlimit.py); for ranks orch launched through torchrun, the exit status of the
   rank that failed on its own first (``exit.json``'s failed_rank, orchestrator/jobside/rankend.py); no exit status
   at all, every process gone, is ``killed`` too: the wrapper, which always writes one, was killed.
Pure function: no I/O, no DB, unit-tested on every row.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass
from datetime import datetime

from orchestrator.backends.base import Outcome, Phase
from orchestrator.core.states import StopReason
from orchestrator.decide.staleness import Stale
from orchestrator.protocol import (
    EXIT_PREEMPTED,
    TIME_LIMIT_SOURCES,
    ExitRecord,
    FailureClass,
    FailureReport,
    MarkerStatus,
    StopRecord,
    Verification,
)

C = FailureClass


@dataclass(frozen=True)
class Classification:
    cls: FailureClass
    step: int | None
    detail: str


def classify(outcome: Outcome, report: FailureReport | None, verification: Verification, *,
             stop_reason: StopReason | None = None, exit_record: ExitRecord | None = None,
             stop_record: StopRecord | None = None, hang: Stale | None = None,
             rank_end: tuple[int, int] | None = None) -> Classification:
    """Class of an attempt that ended (EXITED or VANISHED) and whose marker does not verify.

    ``report``: the program's failure.json (``FailureReport.parse``d). ``stop_reason``: why orch itself
    was stopping the attempt; ``hang``: the typed record observe made when it began a hang stop (which rank
    stopped progressing, at which step, for how long: the attempt's stale_* columns).
    Exit 2 is just a failure here (a grep missing its input): a program whose exit 2 means "usage error,
    retrying cannot help" says so in its failure report (class ``invalid``), as the bundled trainer does.
    """
    step = report.step if report is not None else None
    if stop_reason == StopReason.CANCEL:
        return Classification(C.CANCELLED, step, "stopped by orch cancel")
    dead_hung = _hung_rank_killed(exit_record, rank_end, hang) if stop_reason == StopReason.HANG else None
    if dead_hung is not None:
        # Hostile pass 4: rank 1 kill -9'd before its first heartbeat; rank 0, waiting for it, ignored
        # torchrun's SIGTERM, and the reconciler stopped the attempt for the rank it saw make no progress: the dead
        # one. Its own SIGKILL (recorded by its parent, no stop had reached it) is the end, not the hang it caused.
        return Classification(C.KILLED, None, f"rank {dead_hung} killed by SIGKILL (kill -9, or the kernel OOM killer) "
                                              "before the reconciler stopped the attempt for it: dead, not hung")
    if stop_reason == StopReason.HANG and (report is None or report.cls in (C.PREEMPTED, C.KILLED)):
        # orch itself stopped it: the SIGTERM the job then reports as "preempted" was ours, and a
        # free uncounted resume would hide a job that hangs every time. A "killed" report is the stop's consequence
        # too (a hostile pass: the stopped rank 1 was killed at once, rank 0's collective lost its peer).
        why = hang.describe() if hang is not None else "no heartbeat"  # None: stopped before migration 0010
        return Classification(C.HANG, step, f"stopped by the reconciler: {why}")
    killed = _killed_rank(exit_record, outcome)
    if killed is not None:
        # A kill -9 of rank 0 was `preempted`, from the stop record its peer wrote when torchrun stopped
        # it afterwards. A rank that died of a kill on its own, with no stop delivered, is the attempt's end.
        r, rc = killed
        return Classification(C.KILLED, None, f"rank {r} killed by SIGKILL (kill -9, or the kernel OOM killer); what "
                                              f"its peers recorded after it does not count (torchrun exit {rc})")
    if report is not None and report.cls is C.PREEMPTED and stop_record is not None and exit_record is not None \
            and not exit_record.stop_signal and _after_the_program(stop_record, exit_record):
        # Hostile pass 5: torchrun kill -9'd; the wrapper then stopped the orphaned ranks, whose kit recorded a
        # preemption. A stop that came after the program's own end is a leftover's: its report tells nothing.
        report = None
    if report is not None:
        cls = report.cls
        if cls is C.PREEMPTED and outcome.cause is C.CANCELLED:
            cls = C.CANCELLED  # someone ran scancel: not a free, automatic resume
        if cls is C.PREEMPTED and (outcome.cause is C.TIMEOUT or _warned(exit_record)):
            # The job checkpointed on the warning signal and called it preemption; the scheduler
            # (or the wrapper that passed the warning on) knows it came from the time limit.
            cls = C.TIMEOUT
        return Classification(cls, step, report.detail[:500])
    if outcome.cause is not None:
        detail = f"scheduler state {outcome.backend_state or outcome.cause.value}"
        return Classification(outcome.cause, None, detail + (f"; {outcome.reason}" if outcome.reason else ""))
    if exit_record is not None and exit_record.oom_kill and (outcome.exit_code or outcome.signal):
        # The local backend's memory cgroup (--mem) counted a kernel OOM kill; the bare SIGKILL
        # alone cannot tell it from a kill -9.
        return Classification(C.OOM, None, f"the kernel OOM killer killed {exit_record.oom_kill} process(es) "
                                           "at the attempt's memory limit (--mem)")
    if exit_record is not None and exit_record.stop_signal:
        cls = C.TIMEOUT if exit_record.stop_source in TIME_LIMIT_SOURCES else C.PREEMPTED
        why = str(exit_record.stop_source) + (f" {exit_record.notice}" if exit_record.notice else "")
        rc = outcome.exit_code if outcome.exit_code is not None else "?"
        return Classification(cls, None, f"stopped by SIG{exit_record.stop_signal} ({why}); exit {rc}")
    if stop_record is not None and stop_record.signal == "unknown" and not stop_record.at:
        # A hostile pass: garbage (or a FIFO) at stop.json was `preempted`, requeued uncounted up to 100
        # times. The kit writes it atomically: this came from elsewhere. Never verified, and the program's own.
        rc = outcome.exit_code if outcome.exit_code is not None else "?"
        return Classification(C.CRASH, None, f"stop.json is not a stop record (unreadable or malformed): the "
                                             f"program's own failure, never verified; exit {rc}")
    if stop_record is not None and not _after_the_program(stop_record, exit_record):
        cls = C.TIMEOUT if exit_record is not None and exit_record.time_limit_reached else C.PREEMPTED
        rc = outcome.exit_code if outcome.exit_code is not None else (f"signal {outcome.signal}" if outcome.signal
                                                                      else "?")
        at = f" at step {stop_record.step}" if stop_record.step is not None else ""
        return Classification(cls, stop_record.step, f"the program received SIG{stop_record.signal}{at} "
                              f"(recorded in stop.json; not sent through orch's wrapper); exit {rc}")
    if exit_record is not None and exit_record.disk_full:
        # The wrapper's own exit.json write hit ENOSPC: whatever the program said, it ran on a full disk.
        rc = outcome.exit_code if outcome.exit_code is not None else "?"
        return Classification(C.ENOSPC, None, f"the run dir's filesystem was full when the program ended (exit {rc})")
    if outcome.phase is Phase.VANISHED:
        # Every process gone (liveness decided) and no exit record: the wrapper died with its program, which only a
        # kill does (kill -9 of the session, a cgroup-wide OOM kill, a container kill). As `unknown` it
        # waited for a person, and was missing from the MTBF that --save-interval auto learns from.
        why = outcome.reason or "process vanished without an exit record"
        # Hostile pass: "killed with its wrapper" misled where only the wrapper was killed and the program then ended.
        return Classification(C.KILLED, None, f"{why} (its wrapper was killed: kill -9 of the session or of the "
                                              "wrapper alone, an OOM or container kill)")
    rc, sig = outcome.exit_code, outcome.signal
    if rc == 0 and not sig:
        if verification.status is MarkerStatus.CORRUPT:
            return Classification(C.MARKER_CORRUPT, None, f"exit 0 but marker {verification.reason}")
        return Classification(C.MARKER_MISSING, None, outcome.reason or "exit 0 without a done marker")
    rank = _rank_end(exit_record, rc, sig)
    if rank is not None:
        # Torchrun exits 1 whatever its rank died of (a plain program's kill -9 read as crash); the
        # rank that failed on its own first is the attempt's end, classified as a single process with that end.
        r, rrc = rank
        c = _by_exit(-rrc if rrc < 0 else None, rrc if rrc > 0 else None)
        return Classification(c.cls, None, f"rank {r} {c.detail} (torchrun exit {rc})")
    return _by_exit(sig, rc)


def _killed_rank(rec: ExitRecord | None, outcome: Outcome) -> tuple[int, int | None] | None:
    """(rank, torchrun's exit) when the rank that failed on its own first was SIGKILLed and no stop was delivered
    through the wrapper (a stop's escalation to SIGKILL is that stop's end, not a kill of its own), nor did the
    attempt's memory cgroup count an OOM kill (that is ``oom``)."""
    end = _rank_end(rec, outcome.exit_code, outcome.signal)
    if end is None or rec is None or rec.stop_signal or rec.oom_kill or \
            end[1] not in (-_signal.SIGKILL, 128 + _signal.SIGKILL):
        return None
    return end[0], outcome.exit_code


def _hung_rank_killed(rec: ExitRecord | None, rank_end: tuple[int, int] | None, hang: Stale | None) -> int | None:
    """The rank a hang stop named when its own end, first of all ranks, was a SIGKILL (``rank_end``: the exit
    record's failed rank, or the per-rank records where the stop's SIGKILL left no exit record): the stop found a
    dead rank, not a hung one. A stop's own SIGKILL reaches a rank's parent too, so it is never an own end
    (``rankend``); the named rank must match, so a peer's kill never hides a real hang."""
    if rank_end is None or hang is None or hang.rank != rank_end[0] or (rec is not None and rec.oom_kill) or \
            rank_end[1] not in (-_signal.SIGKILL, 128 + _signal.SIGKILL):
        return None
    return rank_end[0]


def _after_the_program(stop: StopRecord, rec: ExitRecord | None) -> bool:
    """Whether ``stop`` was recorded after the program's own process had ended: a leftover process (a peer rank the
    wrapper stopped once the program was gone) wrote it, so it tells nothing of how the program ended."""
    if rec is None or not rec.program_ended_at or not stop.at:
        return False
    try:
        return datetime.fromisoformat(stop.at) > datetime.fromisoformat(rec.program_ended_at)
    except (TypeError, ValueError):
        return False


def _rank_end(rec: ExitRecord | None, rc: int | None, sig: int | None) -> tuple[int, int] | None:
    """(rank, its returncode) when orch's torchrun itself failed (exit non-zero, not signalled: a kill of torchrun
    is its own end) and the wrapper recorded which rank's own end caused it; never for a clean rank exit."""
    if rec is None or rec.failed_rank is None or rec.rank_returncode in (None, 0):
        return None
    if not rc or sig:
        return None
    return rec.failed_rank, rec.rank_returncode


def _by_exit(sig: int | None, rc: int | None) -> Classification:
    """A failed process's class from its exit status alone (rc non-zero or sig set)."""
    if sig == _signal.SIGTERM or rc == EXIT_PREEMPTED:
        return Classification(C.PREEMPTED, None, "terminated by SIGTERM without a report")
    if sig in (_signal.SIGINT, _signal.SIGHUP):
        # Hostile pass 5: `crash`, parked for a person. orch never stops a job so, and a program does not send it to
        # itself: someone outside (a kill -INT, a terminal's hangup) ended it, as a kill -9 does.
        name = _signal.Signals(sig).name
        return Classification(C.KILLED, None, f"killed by {name} from outside orch (a kill -{name[3:]}, a hangup)")
    if sig == _signal.SIGKILL or rc == 128 + _signal.SIGKILL:
        # A kill -9 with no record was `crash`, left for a manual requeue; it is recoverable.
        return Classification(C.KILLED, None, "killed by SIGKILL (kill -9, or the kernel OOM killer without a "
                                              "memory cgroup to tell)")
    if sig:
        return Classification(C.CRASH, None, f"killed by signal {sig}")
    return Classification(C.CRASH, None, f"exit {rc}")


def _warned(rec: ExitRecord | None) -> bool:
    return rec is not None and rec.stop_source in TIME_LIMIT_SOURCES
