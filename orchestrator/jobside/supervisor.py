"""The program's process and the stops delivered to it: what the job wrapper (``wrapper.py``) supervises.

``Supervisor`` passes each stop to the program once, as the signal it handles, and notes the first (what made the
attempt "stopped", and who sent it: a signal, the scheduler's warning, a time limit, a spot notice); under Slurm,
where Slurm signals every process itself, it only notes. When the program ends, what it left running in the job's
session, or carrying the attempt's token, is stopped with it (``stop_leftovers``), as Slurm ends a job with its
batch script. Stdlib only: it runs on the compute node.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time

from orchestrator import protocol
from orchestrator.filelock import is_stopped
from orchestrator.jobside import proctable
from orchestrator.jobside.ranklaunch import SCONTROL_TIMEOUT_S

STOPS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGUSR2})  # what makes an attempt "stopped"
LEFTOVER_GRACE_S = 5.0  # what a program's leftover processes get between SIGTERM and SIGKILL
# How long, at most, a multi-rank Slurm wrapper waits for Slurm's end-of-grace signal after a preemption ended
# its ranks' step (Slurm signals the batch process GraceTime + up to ~10 s after the step).
PREEMPT_LINGER_S = float(os.environ.get("ORCH_PREEMPT_LINGER_S", "600"))


class Supervisor:
    """The program's process and the stops delivered to it."""

    def __init__(self, child: subprocess.Popen, warning_signal: str, under_slurm: bool,
                 step_job: str | None = None, token: str | None = None) -> None:
        self.child = child
        self.token = token  # the attempt's: processes that left the session but carry it are the job's too
        self.warning = getattr(signal, "SIG" + warning_signal)
        self.under_slurm = under_slurm
        # A Slurm job whose ranks run in job steps (srun): our own stops go to its steps, never to srun.
        self.step_job = step_job
        self._signallers: list[subprocess.Popen] = []
        self.stop_signal: str | None = None  # the first stop the program got (never an --outputs marker)
        self.stop_source: protocol.StopSource | None = None
        self.notice: str | None = None  # the spot notice that caused the stop
        # The spot watcher notes a stop from its own thread; reentrant, since a signal handler runs
        # on the main thread between any two bytecodes, even one inside this lock.
        self._lock = threading.RLock()

    def _note(self, sig: int, source: protocol.StopSource) -> None:
        with self._lock:
            if self.stop_signal is None:
                self.stop_signal, self.stop_source = signal.Signals(sig).name.removeprefix("SIG"), source

    def _send(self, sig: int) -> None:
        if self.step_job is not None:
            self._signal_steps(sig)
            return
        try:
            self.child.send_signal(sig)
        except ProcessLookupError:
            return
        if sig in STOPS:
            # A stopped process cannot act on its stop (a hang stop of one is why it is stopped): continued, as
            # Slurm's SIGCONT+SIGTERM does, it saves and exits within the grace, instead of waiting all of it. Also
            # a rank's orch parent: hostile pass 5 stopped one, and a cancel waited torchrun's whole shutdown timeout
            # (60 s) for it. Never a rank's program: its parent kills it at once if it is stopped (rankend).
            for pid in [self.child.pid, *(p for p in session_members(self.token) if is_rank_parent(p))]:
                if is_stopped(pid):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGCONT)

    def _signal_steps(self, sig: int) -> None:
        """``sig`` to every process of every step of the job, on every node (``scancel --signal`` without
        ``--batch``/``--full`` spares the batch step). Never ``srun`` itself: srun answers SIGTERM by
        SIGKILLing its step (measured on 22.05: the ranks got no chance to checkpoint). Not waited for here
        (a signal handler); reaped at the end."""
        name = signal.Signals(sig).name.removeprefix("SIG")
        try:
            self._signallers.append(subprocess.Popen(
                ["scancel", f"--signal={name}", str(self.step_job)], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        except OSError as e:
            print(f"orch wrapper: cannot signal the job's steps: {e}", file=sys.stderr, flush=True)

    def reap_signallers(self, timeout: float = 30.0) -> None:
        for p in self._signallers:
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()

    def on_signal(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGUSR2:
            # The scheduler's early warning (--signal=B:USR2@lead reaches the batch process only).
            self._note(self.warning, protocol.StopSource.WARNING)
            self._send(self.warning)
        elif signum in (signal.SIGTERM, signal.SIGINT):
            self._note(signum, protocol.StopSource.SIGNAL)
            if not self.under_slurm:
                # Slurm signals every process of the job itself (preemption, scancel, time limit):
                # a second copy from us hit a program that exits in its handler (measured).
                self._send(signum)
        else:
            self._send(signum)

    def on_notice(self, notice: object) -> None:
        """A cloud's spot notice (the watcher thread): the program gets the SIGTERM of a preemption,
        from us, under Slurm too (Slurm knows nothing of it). Nothing for a program already asked to
        stop (a second SIGTERM hit programs that exit in their handler) or already ended (its own
        finish must not be recorded as a stop)."""
        with self._lock:
            if self.stop_signal is not None or not self._running():
                return
            self.notice = str(notice)[:500]
            self._note(signal.SIGTERM, protocol.StopSource.SPOT_NOTICE)
            self._send(signal.SIGTERM)

    def _running(self) -> bool:
        """The program has not exited (WNOWAIT: an exited one stays for the main thread's wait to reap)."""
        if self.child.returncode is not None:
            return False
        try:
            return os.waitid(os.P_PID, self.child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:  # reaped meanwhile by the main thread
            return False

    def await_preemption(self, job_id: str) -> None:
        """The ranks' step ended but no stop reached us: if Slurm is preempting the job, wait (bounded) for its
        signal to the batch process at the grace's end. Exiting now ends the job FAILED during the grace, and
        Slurm does not requeue it in place (measured on 22.05; deploy/slurm/README.md)."""
        if self.stop_signal is not None or not being_preempted(job_id):
            return
        print(f"orch wrapper: the job is being preempted; waiting up to {PREEMPT_LINGER_S:.0f} s for Slurm's "
              "signal so it is requeued in place", file=sys.stderr, flush=True)
        deadline = time.monotonic() + PREEMPT_LINGER_S
        while self.stop_signal is None and time.monotonic() < deadline:
            time.sleep(0.2)  # on_signal notes the stop

    def wait(self, time_limit: float | None, kill_grace: float) -> tuple[int, bool]:
        """Wait for the program; at the time limit SIGTERM it, SIGKILL the session after the grace."""
        timed_out = False
        deadline = time.monotonic() + time_limit if time_limit else None
        while True:
            try:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                return self.child.wait(timeout=timeout), timed_out
            except subprocess.TimeoutExpired:
                if not timed_out:
                    timed_out = True
                    self._note(signal.SIGTERM, protocol.StopSource.TIME_LIMIT)
                    self._send(signal.SIGTERM)
                    deadline = time.monotonic() + kill_grace
                else:
                    kill_session(signal.SIGKILL, self.token)
                    deadline = None


def being_preempted(job_id: str) -> bool:
    """Slurm says the job is in a preemption's grace (``scontrol show job``'s PreemptTime is set, measured on
    22.05 while the job still shows RUNNING). False when it cannot be asked: the wrapper then ends as usual
    and orch requeues the stopped attempt by itself."""
    try:
        p = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                           timeout=SCONTROL_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    m = re.search(r"\bPreemptTime=(\S+)", p.stdout if p.returncode == 0 else "")
    return bool(m) and m.group(1) not in ("None", "Unknown", "(null)")


def session_members(token: str | None = None) -> list[int]:
    """Other live processes of this wrapper's session (the local backend's job), and, with ``token``, those
    whose environment carries the attempt's token: torchrun starts each worker in a session of its own, and
    ranks of a cancelled job outlived torchrun as orphans."""
    me, sid = os.getpid(), os.getsid(0)
    if sid != me:  # not a session leader (run by hand, or under Slurm's slurmstepd): nothing to tidy
        return []
    out = []
    for p in proctable.all_procs():
        if p.pid == me or p.zombie:
            continue
        if p.session == sid or (token and proctable.environ_has(p.pid, protocol.ENV_TOKEN, token)):
            out.append(p.pid)
    return out


def is_rank_parent(pid: int) -> bool:
    """Whether ``pid`` is orch's per-rank parent (``python -m orchestrator.jobside.rankend``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return not proctable.RANK_PARENT_MODULES.isdisjoint(f.read(4096).split(b"\0"))
    except OSError:
        return False


def kill_session(sig: int, token: str | None = None) -> list[int]:
    pids = session_members(token)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    return pids


def stop_leftovers(grace_s: float = LEFTOVER_GRACE_S, token: str | None = None) -> None:
    """What the program left running ends with it: SIGTERM, then SIGKILL after ``grace_s``."""
    if not kill_session(signal.SIGTERM, token):
        return
    deadline = time.monotonic() + grace_s
    while session_members(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    kill_session(signal.SIGKILL, token)
