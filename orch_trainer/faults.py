"""Fault injection: ``--inject-fault KIND@step=N`` makes the REAL failure path run.

Each fault is raised at the code site where the real failure appears, with the real exception type:
``oom`` inside the forward of a micro-batch (the allocator's exception), ``nan`` on the loss the
forward produced, ``enospc`` and ``eio`` inside the checkpoint writer's write call. So a test of an injected
fault exercises the recovery code a real one would (design lesson 3: a retry path nobody has seen
work is not a retry path).

Each fault fires at most once per run dir: it is recorded in ``<run_dir>/.faults_fired.json``
(atomically) BEFORE it fires, so the attempt that follows a ``sigkill`` or ``crash`` runs clean
instead of dying at the same step forever.

Where ``step`` refers to: the optimizer step being computed (step N takes the run from N-1 to N
completed steps). ``enospc`` and ``eio`` fire at the first checkpoint save of a step >= N. The signal faults
(``sigterm``, ``sigkill``, ``hang``, ``crash``) fire at the micro-batch boundary after the first
micro-batch of step N when it has several (i.e. mid-accumulation), else before its only one.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator import protocol

KINDS = ("oom", "nan", "enospc", "eio", "sigterm", "sigkill", "hang", "crash")
_SPEC_RE = re.compile(r"^(?P<kind>[a-z]+)@step=(?P<step>\d+)$")


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    step: int

    def __str__(self) -> str:
        return f"{self.kind}@step={self.step}"


def parse_fault(text: str) -> FaultSpec:
    """Parse ``KIND@step=N``; ValueError names what is wrong (argparse turns it into exit 2)."""
    m = _SPEC_RE.match(text.strip())
    if not m:
        raise ValueError(f"malformed fault {text!r}: want KIND@step=N, KIND one of {', '.join(KINDS)}")
    kind, step = m.group("kind"), int(m.group("step"))
    if kind not in KINDS:
        raise ValueError(f"unknown fault kind {kind!r}: want one of {', '.join(KINDS)}")
    if step < 1:
        raise ValueError(f"fault step must be >= 1 (steps are numbered from 1), got {step}")
    return FaultSpec(kind, step)


def cpu_oom_error(detail: str = "") -> RuntimeError:
    """The exception PyTorch's CPU allocator raises when malloc fails (same type, same message shape)."""
    return RuntimeError(
        "[enforce fail at alloc_cpu.cpp] . DefaultCPUAllocator: can't allocate memory: "
        f"you tried to allocate bytes. {detail}".strip()
    )


class FaultInjector:
    """Pending faults of one run dir; ``take(kind, step)`` records a due fault as fired and returns it.

    Thread-safe: the checkpoint writer thread takes ``enospc`` while the loop takes the others.
    """

    def __init__(self, run_dir: Path, specs: list[FaultSpec], attempt: int) -> None:
        self.path = Path(run_dir) / protocol.FAULTS_FIRED
        self.attempt = attempt
        self._lock = threading.Lock()
        self._fired = self._read_fired()
        if self._fired is None:
            # Written atomically, so unreadable means someone edited it: fire nothing rather than
            # risk a fault that fires on every retry (an endless crash loop).
            print(f"[trainer] {self.path.name} unreadable; injected faults disabled", file=sys.stderr)
            self._fired, specs = {}, []
        self.pending: list[FaultSpec] = [s for s in dict.fromkeys(specs) if str(s) not in self._fired]
        self.pending_kinds = frozenset(s.kind for s in self.pending)  # cheap test on the hot path

    def _read_fired(self) -> dict[str, dict] | None:
        try:
            data = protocol.read_json_bounded(self.path, limit=1 << 20)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            return None
        fired = data.get("fired") if isinstance(data, dict) else None
        return fired if isinstance(fired, dict) else None

    def take(self, kind: str, step: int, *, at_or_after: bool = False) -> FaultSpec | None:
        """The pending fault of ``kind`` due at ``step``, recorded as fired; None if there is none."""
        if kind not in self.pending_kinds:
            return None
        with self._lock:
            for spec in self.pending:
                if spec.kind == kind and (spec.step == step or (at_or_after and step >= spec.step)):
                    # Recorded BEFORE firing: a sigkill or hang never returns to record it afterwards.
                    self._fired[str(spec)] = {"attempt": self.attempt, "step": step, "at": protocol.now_iso()}
                    protocol.atomic_write_json(self.path, {"fired": self._fired})
                    self.pending.remove(spec)
                    self.pending_kinds = frozenset(s.kind for s in self.pending)
                    print(f"[trainer] injecting fault {spec} (attempt {self.attempt})", file=sys.stderr,
                          flush=True)
                    return spec
        return None

    # --- actions of the faults that are not an exception at a library call site -----------------
    @staticmethod
    def act_process_fault(spec: FaultSpec) -> None:
        """sigterm / sigkill / hang / crash: do to this process what the real event would."""
        if spec.kind == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)  # the real signal: the installed handler sets the flag
        elif spec.kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif spec.kind == "hang":
            while True:  # no progress, no heartbeat: what a stuck collective looks like from outside
                time.sleep(3600)
        elif spec.kind == "crash":
            raise RuntimeError(f"injected crash ({spec})")

    @staticmethod
    def enospc_error(path: str) -> OSError:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC) + " (injected)", path)

    @staticmethod
    def eio_error(path: str) -> OSError:
        """What a failing disk or a lost NFS server returns from write(): EIO, once."""
        return OSError(errno.EIO, os.strerror(errno.EIO) + " (injected)", path)
