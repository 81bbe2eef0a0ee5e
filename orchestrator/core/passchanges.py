"""What one reconcile pass (or the part of ``orch requeue`` that settles attempts) changed, as it reports it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.lifecycle import AttemptState, JobState
from orchestrator.core.retryplan import Action
from orchestrator.protocol import FailureClass


@dataclass(frozen=True)
class Change:
    """One thing a pass changed, as ``orch reconcile`` prints it (``--json``: the keys it always had)."""

    name: str
    to: JobState | AttemptState
    why: str | None = None
    cls: FailureClass | None = None
    action: Action | None = None

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "to": self.to.value}
        for key, v in (("class", self.cls), ("action", self.action), ("why", self.why)):
            if v:
                d[key] = str(v)
        return d


@dataclass
class PassReport:
    ran: bool = True
    polled: int = 0
    backend_calls: int = 0
    changed: list[Change] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    unknown: int = 0
    undecided: list[str] = field(default_factory=list)  # "<job>: <why>" for each unknown with a reason
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # e.g. the lease taken from a stopped reconciler
    lease_holder: str = ""  # a pass that did not run: who held the lease
    query_failures: int = 0  # scheduler queries (poll, find by token) that could not be answered
    duration_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "changed": [c.as_dict() for c in self.changed]}
