"""The policy's decision after an attempt ended, as one frozen, typed value: ``RetryPlan``.

It is stored on the ended attempt (``attempts.action_json``: what ``orch show`` calls the action) and
copied onto the next attempt (``attempts.plan_json``: what its launch must do first). Before this
type the decision travelled as a dict whose keys were spelled in three modules and whose backoff was
an ISO string compared as text.

Who reads what:
- ``launch``: ``resume`` (a one-shot resume point), ``quarantine`` and ``prune`` (run-dir paths to
  move to the trash), ``empty_trash``;
- ``reconcile``/``policy``: ``overrides`` and ``resources`` are merged into the job for every later
  attempt (``jobs.overrides_json``, ``jobs.resources_json``); ``auto`` and ``not_before`` are
  copied to ``jobs.auto_requeue`` and ``jobs.retry_not_before``, which the auto-requeue query
  filters on in SQL;
- ``orch show``: all of it, through ``as_dict``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any


class Action(enum.StrEnum):
    """What the next attempt does (stored as these strings in ``attempts.action_json``)."""

    RESUME = "resume"  # from the newest verified checkpoint
    ROLLBACK = "rollback"  # NaN: from an earlier verified checkpoint, LR lowered, suspect batches skipped
    MORE_MEMORY = "more_memory"  # OOM: resume with more --mem
    PRUNE_AND_RESUME = "prune_and_resume"  # disk full: old checkpoints and the trash go first
    GIVE_UP = "give_up"  # no next attempt: the job failed for good
    NONE = "none"  # no next attempt: it was cancelled

    @property
    def retries(self) -> bool:
        """A next attempt follows this decision (what `orch requeue` carries to it)."""
        return self not in (Action.GIVE_UP, Action.NONE)


ACTIONS = tuple(a.value for a in Action)


def _frozen(m: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((m or {}).items()))


@dataclass(frozen=True)
class RetryPlan:
    action: Action
    why: str = ""
    auto: bool = False  # the reconciler requeues by itself (else it waits for `orch requeue`)
    not_before: datetime | None = None  # backoff: no auto-requeue before this (naive UTC)
    resume: str | None = None  # one-shot resume point for the next attempt: a run-dir path, or "none"
    overrides: tuple[tuple[str, Any], ...] = ()  # sticky: lr, skip_batches, micro_batch_size
    resources: tuple[tuple[str, Any], ...] = ()  # sticky: mem_mb
    quarantine: tuple[str, ...] = ()  # run-dir paths the next launch moves to the trash
    prune: tuple[str, ...] = ()
    empty_trash: bool = False
    details: tuple[tuple[str, Any], ...] = field(default=())  # for people: resume_step, lr_before, ...

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}")
        object.__setattr__(self, "action", Action(self.action))

    @classmethod
    def make(cls, action: Action | str, *, overrides: Mapping[str, Any] | None = None,
             resources: Mapping[str, Any] | None = None, details: Mapping[str, Any] | None = None,
             quarantine: tuple[str, ...] | list[str] = (), prune: tuple[str, ...] | list[str] = (),
             **kw: Any) -> RetryPlan:
        return cls(action, overrides=_frozen(overrides), resources=_frozen(resources), details=_frozen(details),
                   quarantine=tuple(quarantine), prune=tuple(prune), **kw)

    def with_(self, **kw: Any) -> RetryPlan:
        for k in ("overrides", "resources", "details"):
            if k in kw and isinstance(kw[k], Mapping):
                kw[k] = _frozen(kw[k])
        return replace(self, **kw)

    @property
    def overrides_dict(self) -> dict[str, Any]:
        return dict(self.overrides)

    @property
    def resources_dict(self) -> dict[str, Any]:
        return dict(self.resources)

    @property
    def details_dict(self) -> dict[str, Any]:
        return dict(self.details)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (stored, and shown by ``orch show --json`` as the attempt's ``action``)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("overrides", "resources", "details"):
                v = dict(v)
            elif f.name in ("quarantine", "prune"):
                v = list(v)
            elif f.name == "not_before":
                v = v.isoformat() if v else None
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RetryPlan:
        nb = d.get("not_before")
        if "action" not in d:  # it read as "resume": a plan that lost its action must not resume silently
            raise ValueError("a retry plan without an action")
        return cls.make(
            d["action"], why=str(d.get("why") or ""), auto=bool(d.get("auto")),
            not_before=datetime.fromisoformat(nb) if isinstance(nb, str) and nb else None,
            resume=d.get("resume") if isinstance(d.get("resume"), str) else None,
            overrides=d.get("overrides") or {}, resources=d.get("resources") or {},
            details=d.get("details") or {}, quarantine=tuple(d.get("quarantine") or ()),
            prune=tuple(d.get("prune") or ()), empty_trash=bool(d.get("empty_trash")))
