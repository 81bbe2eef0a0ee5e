"""Slurm job states -> orch backend phases: pure functions, no I/O, unit-tested without a cluster.

Who calls: ``orchestrator.backends.slurm.backend`` (the only place that runs sacct/squeue). What it
guarantees: a Slurm state orch does not know maps to UNKNOWN, never to EXITED, so a new state in
a future Slurm release can delay a decision but never fail a job.

Facts this rests on (measured on Slurm 22.05.8, deploy/slurm/cluster.sh; see deploy/slurm/README.md):

* ``sacct -X --duplicates`` lists one record per run of a job id. A job preempted on a REQUEUE
  partition shows ``PREEMPTED`` for the first run and a new record (higher DBIndex) ``PENDING`` /
  ``RUNNING`` for the rerun under the same id. The newest record wins.
* For about 5 s after such a preemption, sacct's newest record is still ``PREEMPTED`` while the
  controller (squeue) already says ``COMPLETING`` then ``PENDING`` (reason BeginTime): sacct alone
  would call a job that Slurm is requeueing in place "exited". The controller's live state,
  when it has one, therefore overrides a terminal sacct state (``combine``).
* sacct 22.05 has no ``Restarts`` field; the restart count is the number of earlier records, and each
  earlier record's State says why that run ended (``PREEMPTED``, ``NODE_FAIL`` for a node set down under a
  ``--requeue`` job): ``Outcome.restart_causes``.
* Job ids are reused when a controller loses its state; records whose name is not the attempt's
  ``orch-<token>`` are ignored by the caller, so another job's record never answers for ours.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime

from orchestrator.backends.base import Outcome, Phase
from orchestrator.protocol import FailureClass

# sacct/squeue state names (Slurm 22.05, src/common/slurm_protocol_defs.c job_state_string).
PENDING_STATES = frozenset({
    "PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT",
})
RUNNING_STATES = frozenset({
    "RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "RESIZING", "SIGNALING", "STAGE_OUT",
    "STOPPED", "POWER_UP_NODE", "UPDATE_DB",
})
EXITED_STATES = frozenset({
    "COMPLETED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "CANCELLED", "PREEMPTED",
    "BOOT_FAIL", "DEADLINE", "REVOKED",
})
# Terminal states after which Slurm may still requeue the same id in place (PreemptMode=REQUEUE,
# --requeue on node failure). Without the controller's word these are not trusted as final.
MAYBE_REQUEUED_STATES = frozenset({"PREEMPTED", "NODE_FAIL"})

# The line slurmstepd writes into the job's output when JobAcctGatherParams=OverMemoryKill kills a
# job (no cgroups): sacct then says FAILED 0:9, not OUT_OF_MEMORY. Matched case-insensitively.
OVER_MEMORY_MARKERS = ("exceeded memory limit", "exceeded job memory limit")
OOM_STATE = "OUT_OF_MEMORY"

# Terminal states that say WHY a job ended, whatever its exit code: Slurm's vocabulary ends here,
# as the ``cause`` of an Outcome (orchestrator.decide.classify never sees a Slurm state name).
STATE_CAUSE = {
    "PREEMPTED": FailureClass.PREEMPTED,
    "TIMEOUT": FailureClass.TIMEOUT,
    "DEADLINE": FailureClass.TIMEOUT,
    "OUT_OF_MEMORY": FailureClass.OOM,
    "NODE_FAIL": FailureClass.NODE_FAIL,
    "BOOT_FAIL": FailureClass.NODE_FAIL,
    "CANCELLED": FailureClass.CANCELLED,
}
# Why an earlier run of a requeued id ended, from its own sacct record: only the states Slurm requeues in place
# from. Any other (REQUEUED by a user, a state orch does not know) gives no cause, so the run's own records
# decide, never a guess from here (a NODE_FAIL rerun in place was shown as a preemption).
RESTART_CAUSE = {
    "PREEMPTED": FailureClass.PREEMPTED,
    "NODE_FAIL": FailureClass.NODE_FAIL,
    "BOOT_FAIL": FailureClass.NODE_FAIL,
}


def normalize_state(raw: str) -> str:
    """``"CANCELLED by 0"`` -> ``"CANCELLED"``; strip sacct's truncation ``+`` and whitespace."""
    s = (raw or "").strip().split(" ", 1)[0].rstrip("+").upper()
    return s


def phase_of(state: str) -> Phase:
    s = normalize_state(state)
    if s in PENDING_STATES:
        return Phase.PENDING
    if s in RUNNING_STATES:
        return Phase.RUNNING
    if s in EXITED_STATES:
        return Phase.EXITED
    return Phase.UNKNOWN


def parse_exit_code(field: str) -> tuple[int | None, int | None]:
    """sacct ``ExitCode`` ``"a:b"`` -> (exit code a, signal b or None when 0); (None, None) if unreadable."""
    code, _, sig = (field or "").strip().partition(":")
    try:
        c = int(code)
    except ValueError:
        return None, None
    try:
        s = int(sig) if sig else 0
    except ValueError:
        s = 0
    return c, (s or None)


@dataclass(frozen=True)
class SacctRecord:
    """One line of ``sacct -X --duplicates --parsable2`` (see ``SACCT_FIELDS``)."""

    job_id: str
    name: str
    state: str  # normalized
    exit_code: int | None
    signal: int | None
    db_index: int
    reason: str = ""
    nodes: str | None = None  # NodeList (compressed); None for "None assigned" (never started)
    # When this run started and ended (epoch s; None: not started, or still running): the scheduler's account of
    # the machine time each run held, which goodput counts (issue 45: a run no reconcile pass saw was lost).
    start: float | None = None
    end: float | None = None


# JobID: for array tasks it is "<array id>_<task>" (JobIDRaw is a per-task number that orch never learns);
# for plain jobs it equals JobIDRaw. Lines without it parse as plain jobs. NodeList comes last: where the run
# was (suspect nodes need it for an attempt whose wrapper left no exit record). Start and End: each run's hold,
# asked as epoch seconds (``SACCT_ENV``). Parsed by position.
SACCT_FIELDS = ("JobIDRaw", "JobName", "State", "ExitCode", "DBIndex", "Reason", "JobID", "NodeList", "Start", "End")
# Slurm prints times in the caller's SLURM_TIME_FORMAT: "%s" makes them epoch seconds, whatever the controller's
# time zone or a user's own format ("relative" prints "Tomorr 12:00").
SACCT_ENV = {"SLURM_TIME_FORMAT": "%s"}
_MIN_SACCT_FIELDS = 6  # JobIDRaw..Reason: JobID and NodeList may be missing
_NO_NODES = ("", "None assigned", "None")
_ARRAY_TASK_RE = re.compile(r"^(\d+)_(\d+)$")
_ARRAY_PENDING_RE = re.compile(r"^(\d+)_\[([0-9,\-:%]+)\]$")
MAX_EXPANDED_TASKS = 100_000


def expand_array_ranges(spec: str) -> list[int]:
    """``"2-4%2"`` / ``"1,5,7-9"`` / ``"0-10:2"`` -> the task indices (a pending array's collapsed record)."""
    spec = spec.split("%", 1)[0]
    out: list[int] = []
    for part in spec.split(","):
        rng, _, step = part.partition(":")
        a, _, b = rng.partition("-")
        if not a.isdigit() or (b and not b.isdigit()) or (step and not step.isdigit()):
            return []
        lo, hi, st = int(a), int(b or a), int(step or 1)
        if hi < lo or st < 1 or len(out) + (hi - lo) // st + 1 > MAX_EXPANDED_TASKS:
            return []
        out.extend(range(lo, hi + 1, st))
    return out


def record_keys(job_id_raw: str, job_id: str) -> list[str]:
    """The ids one sacct line answers for: ``"7"``, ``"7_3"``, or every task of a collapsed
    ``"7_[2-4%2]"`` (array tasks that have not started yet share one record)."""
    if _ARRAY_TASK_RE.match(job_id):
        return [job_id]
    m = _ARRAY_PENDING_RE.match(job_id)
    if m:
        return [f"{m.group(1)}_{t}" for t in expand_array_ranges(m.group(2))]
    return [job_id_raw] if job_id_raw.isdigit() else []


def parse_sacct(text: str) -> dict[str, list[SacctRecord]]:
    """job id (``"7"`` or ``"7_3"``) -> its records, oldest first (by DBIndex, then output order).

    Malformed lines, steps (``7.batch``) and headers are skipped.
    """
    out: dict[str, list[tuple[int, int, SacctRecord]]] = {}
    for n, line in enumerate(text.splitlines()):
        parts = line.split("|")
        if len(parts) < _MIN_SACCT_FIELDS:
            continue
        raw, name, state, exit_field, dbi, reason = (x.strip() for x in parts[:6])
        keys = record_keys(raw, parts[6].strip() if len(parts) > 6 else raw)
        nodes = parts[7].strip() if len(parts) > 7 else ""
        start, end = (parse_time(parts[i]) if len(parts) > i else None for i in (8, 9))
        try:
            db_index = int(dbi)
        except ValueError:
            db_index = -1
        code, sig = parse_exit_code(exit_field)
        for key in keys:
            rec = SacctRecord(key, name, normalize_state(state), code, sig, db_index, reason,
                              None if nodes in _NO_NODES else nodes, start, end)
            out.setdefault(key, []).append((db_index, n, rec))
    return {k: [r for _, _, r in sorted(v, key=lambda t: (t[0], t[1]))] for k, v in out.items()}


def parse_time(text: str) -> float | None:
    """sacct's Start or End as epoch seconds: ``1796607816`` (``SACCT_ENV``), or an ISO time in this host's zone
    (sacct without it); ``Unknown``, ``None`` and anything else: None (not started, or still running)."""
    t = text.strip()
    if t.isdigit():
        return float(t) if 0 < int(t) < 1 << 40 else None
    try:
        return datetime.fromisoformat(t).timestamp() if t[:1].isdigit() else None
    except ValueError:
        return None


SQUEUE_FORMAT = "%i|%j|%T|%r"


def parse_squeue(text: str) -> dict[str, tuple[str, str, str]]:
    """``squeue -h -r -t all -o '%i|%j|%T|%r'`` -> job id (``7`` or ``7_3``) -> (name, state, reason).

    ``-r`` lists one line per array task; a collapsed ``7_[2-4]`` line (without ``-r``) is expanded.
    """
    out: dict[str, tuple[str, str, str]] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 4:
            continue
        jid = parts[0].strip()
        for key in record_keys(jid if jid.isdigit() else "", jid):
            out[key] = (parts[1].strip(), normalize_state(parts[2]), "|".join(parts[3:]).strip())
    return out


def array_of(external_id: str) -> str:
    """The id to ask sacct/squeue/scancel about: the array's id for an array task."""
    return external_id.split("_", 1)[0]


def is_job_id(external_id: object) -> bool:
    return isinstance(external_id, str) and (external_id.isdigit() or bool(_ARRAY_TASK_RE.match(external_id)))


def outcome_from_records(records: Iterable[SacctRecord], *, over_memory_line: str | None = None) -> Outcome:
    """Outcome of one attempt from all its sacct records (one per run of the id): the newest wins.

    ``over_memory_line``: the job output's "exceeded memory limit" line, if the caller found one;
    a FAILED/CANCELLED run with it is reported as OUT_OF_MEMORY (the OverMemoryKill form).
    """
    recs = fold_resizes(list(records))
    if not recs:
        return Outcome(Phase.UNKNOWN, reason="no sacct record")
    newest = recs[-1]
    restarts = len(recs) - 1
    causes = restart_causes(recs[:-1])
    runs = held_runs(recs)
    phase = phase_of(newest.state)
    if phase is Phase.UNKNOWN:
        return Outcome(Phase.UNKNOWN, backend_state=newest.state, restart_count=restarts,
                       reason=f"unrecognised Slurm state {newest.state!r}", restart_causes=causes, runs=runs)
    if phase is not Phase.EXITED:
        return Outcome(phase, backend_state=newest.state, restart_count=restarts, reason=_reason(newest),
                       restart_causes=causes, runs=runs)
    state = newest.state
    reason = _reason(newest)
    if over_memory_line and state in ("FAILED", "CANCELLED"):
        state = OOM_STATE
        reason = over_memory_line.strip()[:300]
    return Outcome(Phase.EXITED, exit_code=newest.exit_code, signal=newest.signal, backend_state=state,
                   reason=reason, restart_count=restarts, cause=STATE_CAUSE.get(state), nodes=newest.nodes,
                   restart_causes=causes, runs=runs)


def fold_resizes(recs: list[SacctRecord]) -> list[SacctRecord]:
    """The records of the job's runs: a RESIZING record is the same run before its node list changed (a node lost
    under ``--no-kill``, measured on 22.05: RESIZING on n[2-3],vm then COMPLETED on n2,vm), never a run of its own.
    Counted as one, a spare node's job showed restarts=1 although Slurm ran it once; the run starts where the first
    of its records does."""
    out: list[SacctRecord] = []
    start: float | None = None
    for k, r in enumerate(recs):
        if r.state == "RESIZING" and k < len(recs) - 1:
            start = r.start if start is None else start
            continue
        out.append(r if start is None else replace(r, start=start))
        start = None
    return out


def held_runs(recs: Iterable[SacctRecord]) -> tuple[tuple[float, float | None], ...]:
    """(start, end) of every run that started, oldest first; end None while it runs. A run that never started
    (cancelled while pending) held nothing and is left out; an end before its start is read as none."""
    return tuple((r.start, r.end if r.end is not None and r.end >= r.start else None)
                 for r in recs if r.start is not None)


def restart_causes(earlier: Iterable[SacctRecord]) -> tuple[FailureClass | None, ...]:
    """Why each earlier run of an id ended (oldest first), from its sacct record; None where its state is not one
    Slurm requeues in place from."""
    return tuple(RESTART_CAUSE.get(r.state) for r in earlier)


def _reason(rec: SacctRecord) -> str:
    return "" if rec.reason in ("", "None") else rec.reason


def combine(sacct_outcome: Outcome | None, live: tuple[str, str, str] | None, *,
            live_known: bool) -> Outcome:
    """Merge sacct's view (``outcome_from_records``) with the controller's (squeue) for one attempt.

    ``live``: squeue's (name, state, reason) for the id, None when squeue does not list it;
    ``live_known``: whether squeue answered at all. Rules (see the module docstring for why):

    * the controller lists the job as pending/running/completing -> that phase, whatever sacct says:
      it is the authority on live jobs and is ahead of sacct after an in-place requeue;
    * sacct has no record -> UNKNOWN (submitted seconds ago, or the accounting DB lags): never
      EXITED without sacct's record of how the job ended;
    * sacct says terminal and the controller does not contradict it -> EXITED, except that a state
      after which Slurm may still requeue in place (PREEMPTED, NODE_FAIL) is UNKNOWN while the
      controller cannot be asked.
    """
    if live is not None:
        _, lstate, lreason = live
        lphase = phase_of(lstate)
        if lphase in (Phase.PENDING, Phase.RUNNING):
            restarts = sacct_outcome.restart_count if sacct_outcome else 0
            causes = sacct_outcome.restart_causes if sacct_outcome else ()
            if (sacct_outcome is not None and sacct_outcome.phase is Phase.EXITED
                    and sacct_outcome.backend_state in MAYBE_REQUEUED_STATES and lstate != "COMPLETING"):
                # requeued in place; the rerun's record has not reached sacct yet. Only after a state Slurm
                # requeues from (a task sacct had COMPLETED, still listed RUNNING as a prio job
                # arrived, was shown restarts=1). The newest record is then the earlier run's: its cause too.
                restarts += 1
                causes = (*causes, RESTART_CAUSE.get(sacct_outcome.backend_state))
            return Outcome(lphase, backend_state=lstate, restart_count=restarts,
                           reason="" if lreason in ("", "None") else lreason, restart_causes=causes,
                           runs=sacct_outcome.runs if sacct_outcome else ())
    if sacct_outcome is None or sacct_outcome.phase is Phase.UNKNOWN:
        why = "no sacct record" + (f"; squeue says {live[1]}" if live else "; squeue does not list it")
        return Outcome(Phase.UNKNOWN, backend_state=live[1] if live else None, reason=why,
                       restart_count=sacct_outcome.restart_count if sacct_outcome else 0,
                       restart_causes=sacct_outcome.restart_causes if sacct_outcome else (),
                       not_live=live_known and (live is None or phase_of(live[1]) is Phase.EXITED))
    if (sacct_outcome.phase is Phase.EXITED and not live_known
            and sacct_outcome.backend_state in MAYBE_REQUEUED_STATES):
        return Outcome(Phase.UNKNOWN, backend_state=sacct_outcome.backend_state,
                       restart_count=sacct_outcome.restart_count, restart_causes=sacct_outcome.restart_causes,
                       reason=f"sacct says {sacct_outcome.backend_state}; squeue could not confirm it")
    return sacct_outcome


# sinfo's short states (%t) in which a node can take a job; a trailing flag (~: powered off, #: powering up,
# !, %, $, @, ^, -) is read as the base state, except '*' (not responding), which is kept and so never matches.
USABLE_NODE_STATES = frozenset({"idle", "mix", "alloc", "comp"})


def usable_nodes(text: str, partition: str | None) -> frozenset[str]:
    """``sinfo -h -N -o '%N|%P|%t'`` -> the nodes of ``partition`` (None: the default one, ``gpu*``) whose
    state can run a job."""
    out = set()
    for line in text.splitlines():
        parts = [x.strip() for x in line.split("|")]
        if len(parts) != 3:
            continue
        node, part, state = parts
        default = part.endswith("*")
        if (part.rstrip("*") != partition) if partition is not None else not default:
            continue
        if state.rstrip("~#!%$@^-") not in USABLE_NODE_STATES:  # "idle*" (not responding) stays unusable
            continue
        out.add(node)
    return frozenset(out)
