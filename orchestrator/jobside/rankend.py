"""Each rank's own end, recorded: ``python -m orchestrator.jobside.rankend --dir D --launch L -- CMD``.

When orch launches the ranks (``--nproc-per-node``), torchrun runs every rank's program under this small
parent. torchrun exits 1 whatever a rank died of, and its own account cannot tell the cause from the
consequence: torch 2.13's ``SubprocessContext._poll`` puts the SIGTERM/SIGKILL it sends the surviving ranks
"for bookkeeping" into the same ``ChildFailedError.failures`` as the rank that died first, with timestamps in
whole seconds. This parent knows what torch cannot: whether the program ended on its own (an exit code, or a
signal nobody above sent: a user's kill -9, the kernel OOM killer, SIGSEGV), or after a stop from above
reached it (torchrun signals each rank's whole process group, this parent included, and its final SIGKILL
takes this parent too, leaving no record at all).

It writes ``<D>/rank-end.<L>.<RANK>.json`` and then ends as the program did (the same exit code, or the same
signal), so torchrun sees what it would have seen. The job can write that file too: the wrapper reads it with
``read_rank_ends`` (every field checked, only its own launch and token) and ``first_own_end`` picks the rank whose
own end came first; classify.py then classifies the attempt as a single process with that end.

Stdlib + protocol only (it starts once per rank).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator import protocol, testhooks
from orchestrator.jobside.cmdline import parse_with_command

# The stops torchrun passes on to its workers (ranks.SIGNALS_TO_HANDLE); it sends them to the process group.
STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
RECORD_LIMIT = 4096
FILE_PREFIX = "rank-end."
TORCHRUN_DIR = "torchrun"  # attempts/<n>/torchrun: torchrun's own files and these records


@dataclass(frozen=True)
class RankEnd:
    """How one rank's program ended: ``returncode`` as Popen gives it (-N: killed by signal N)."""

    rank: int
    returncode: int
    at: float  # wall-clock seconds: the order of ends across nodes
    stopped: bool  # a stop from above (torchrun, orch) reached it first: a consequence, never the cause

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode < 0 else None


def record_path(directory: Path | str, launch: str, rank: int) -> Path:
    return Path(directory) / f"{FILE_PREFIX}{launch}.{rank}.json"


def read_rank_ends(directory: Path | str, launch: str, token: str, world_size: int) -> list[RankEnd]:
    """The valid records of this launch, one per rank at most (never raises).

    Each file is the job's to write: a record that is not a small JSON object of this launch's token and
    rank, with an int return code in range, a finite time and a boolean ``stopped``, is ignored (then the
    attempt is classified from torchrun's own exit, as before).
    """
    out = []
    for rank in range(max(0, world_size)):
        try:
            r = protocol.read_json_bounded(record_path(directory, launch, rank), limit=RECORD_LIMIT)
        except (OSError, ValueError):
            continue
        end = parse_rank_end(r, launch, token, rank)
        if end is not None:
            out.append(end)
    return out


def parse_rank_end(r: object, launch: str, token: str, rank: int) -> RankEnd | None:
    """One record, checked: None unless every field has its type and range (a hostile file: test_rank_end_records)."""
    if not isinstance(r, dict) or r.get("token") != token or r.get("launch") != launch:
        return None
    rc, at, stopped = r.get("returncode"), r.get("at"), r.get("stopped")
    if r.get("rank") != rank or not protocol.is_int(r.get("rank"), 0, 10**7):
        return None
    if not protocol.is_int(rc, protocol.RANK_RETURNCODE_MIN, protocol.RANK_RETURNCODE_MAX):
        return None
    if not isinstance(stopped, bool):
        return None
    at = protocol.finite_number(at)
    if at is None:
        return None
    return RankEnd(rank, int(rc), at, stopped)


# What a peer's death does to the ranks left: a collective fails, and the rank raises (an exit code) or gloo
# aborts it (SIGABRT). No peer's death sends a rank any other signal.
CONSEQUENCE_SIGNALS = frozenset({signal.SIGABRT})


def first_own_end(ends: list[RankEnd], world_size: int | None = None) -> RankEnd | None:
    """The rank whose program failed on its own first: the attempt's end, or None where the ends cannot tell. A
    clean exit is never one (it cannot turn a failure into success), and a rank a stop from above reached is a
    consequence of another's end.

    The times are when each rank's parent saw its end, which is not when the failure began, so the kind of end
    comes first: a signal no peer's death can cause (SIGKILL, SIGSEGV, ...), then an exit code, and the time only
    within a kind. A survivor's gloo abort for the lost peer was recorded 0.6 ms before the SIGKILL that caused
    it, and before the exit of a rank that raised: that rank's teardown closes its process group (the peer
    aborts) before its interpreter has finished exiting (both seen on a loaded machine).

    An abort (SIGABRT) is what a lost peer does to a rank, so it names its rank only when no other rank can be
    its cause: every other rank's end is recorded and clean. Otherwise the ends do not say who began it (CI, twice:
    rank 1 raised and, on its way out, aborted itself, or was stopped by torchrun after rank 0's abort was seen;
    naming the abort by time named rank 0), and the attempt is classified from torchrun's own exit."""
    own = [e for e in ends if e.returncode != 0 and not e.stopped]
    proven = [e for e in own if _kind_of_end(e) < 2]
    if not proven:
        # A rank torchrun's stop reached while it was already exiting with an error code of its own (not the
        # stop's 143) failed on its own: seen in CI, rank 1 raised, rank 0's gloo aborted, torchrun then stopped
        # rank 1 before its exit 1 was seen.
        proven = [e for e in ends
                  if e.stopped and e.signal is None and e.returncode not in (0, protocol.EXIT_PREEMPTED)]
    if proven:
        return min(proven, key=lambda e: (_kind_of_end(e), e.at, e.rank))
    n = len(ends) if world_size is None else world_size
    if len(own) == 1 and len(ends) == n and all(e.returncode == 0 for e in ends if e is not own[0]):
        return own[0]  # the only rank that did not end cleanly: no peer was lost before it
    if world_size is not None and ends and len(ends) == world_size - 1 and all(e.stopped for e in ends):
        # One rank has no record and every other was stopped because of it. Its parent records every end but a
        # SIGKILL of itself (hostile pass 5: kill -9 of rank 0's orch parent was `preempted`, from the stop
        # record its orphaned program wrote when the wrapper tidied up): that rank was killed.
        seen = {e.rank for e in ends}
        rank = next(r for r in range(world_size) if r not in seen)
        return RankEnd(rank, -signal.SIGKILL, max(e.at for e in ends), stopped=False)
    return None


def _kind_of_end(e: RankEnd) -> int:
    """0: killed by a signal no peer's death sends; 1: an exit code; 2: an abort, as a lost peer's collective does."""
    if e.signal is None:
        return 1
    return 2 if e.signal in CONSEQUENCE_SIGNALS else 0


# ------------------------------------------------------------------------------------------------
# the per-rank parent
# ------------------------------------------------------------------------------------------------
def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="orchestrator.jobside.rankend")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--launch", required=True)
    return parse_with_command(ap, argv)


def main(argv: list[str] | None = None) -> int:
    a = _parse(sys.argv[1:] if argv is None else argv)
    stopped: list[int] = []
    running: list[subprocess.Popen] = []

    def on_stop(signum: int, _frame: object) -> None:
        # torchrun signals the process group: the program got its own copy; a second one from us would hit a
        # program that exits in its handler. Noted only: this rank's end is now a consequence. A program that is
        # stopped (SIGSTOP, Ctrl-Z) can never use the grace its stop gives it: it is killed at once (a
        # hang stop waited out its whole grace for a stopped rank).
        stopped.append(signum)
        _kill_if_stopped(running)

    for s in STOPS:
        signal.signal(s, on_stop)
    testhooks.site("rank_before_program")
    before = len(stopped)  # stops that came before the program existed: it never got its own copy
    try:
        child = subprocess.Popen(a.command)
    except OSError as e:
        print(f"orch rankend: cannot start {a.command[0]!r}: {e}", file=sys.stderr, flush=True)
        return 127
    running.append(child)
    if before:
        # Hostile pass 5 (found in review of its fix): torchrun's stop reached this parent before it started the
        # program, which then ran on, unstopped, until torchrun's SIGKILL at its shutdown timeout.
        with contextlib.suppress(OSError):
            child.send_signal(stopped[0])
    if stopped:  # the stop came while Popen ran: the program can print and stop before Popen returns (CI, loaded)
        _kill_if_stopped(running)
    rc = child.wait()  # a stop's handler runs meanwhile; the wait resumes (PEP 475)
    _record(a, rc, bool(stopped))
    return _end_as(rc)


def _kill_if_stopped(running: list[subprocess.Popen]) -> None:
    """Kill the program if it is stopped: a stopped program can never run the handler the stop is meant for."""
    if running and _is_stopped(running[0].pid):
        with contextlib.suppress(OSError):
            running[0].kill()


def _is_stopped(pid: int) -> bool:
    """Whether the process is stopped (state T: SIGSTOP, Ctrl-Z) and so cannot run a signal handler. Read here, not
    through backends.proctable: this parent starts once per rank on stdlib + protocol alone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2:].split()[0] in (b"T", b"t")
    except (OSError, ValueError, IndexError):
        return False


def _record(a: argparse.Namespace, rc: int, stopped: bool) -> None:
    """Best effort: a record that cannot be written costs the class (torchrun's exit 1: crash), never the rank."""
    rank = os.environ.get("RANK", "")
    if not rank.isdigit():
        return
    try:
        os.makedirs(a.dir, exist_ok=True)
        protocol.atomic_write_json(record_path(a.dir, a.launch, int(rank)), {
            "token": os.environ.get(protocol.ENV_TOKEN, ""), "launch": a.launch, "rank": int(rank),
            "returncode": rc, "stopped": stopped, "at": time.time(), "pid": os.getpid(),
            # which node it ran on: Slurm's name for it (several nodes may share one host name), else the host's
            "node": os.environ.get("SLURMD_NODENAME") or os.uname().nodename})
    except OSError as e:
        print(f"orch rankend: cannot record rank {rank}'s end: {e}", file=sys.stderr, flush=True)


def _end_as(rc: int) -> int:
    """End as the program did: its exit code, or its signal (torchrun's ``exitcode: -9`` stays true)."""
    if rc >= 0:
        return rc
    sig = -rc
    try:
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # their handler cannot be set (EINVAL): ended as 137
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
    except (OSError, ValueError):
        pass
    return 128 + sig  # a signal whose default action is not to end a process


if __name__ == "__main__":
    sys.exit(main())
