"""Suspect nodes: a node on which several different jobs failed in a short time is kept out
of new attempts for a while (``sbatch --exclude``), on backends that can exclude nodes.

The rule (defaults in orchestrator/core/settings.py, table ``[nodes]`` of orch.toml):

* a *failure* is an attempt that ended ``crash``, ``node_fail``, ``hang`` or ``killed`` (the classes a bad
  node causes); preemptions, time limits, OOM, NaN, cancels and the program's own invalid input never count;
* a node is a *suspect* once failures of ``nodes.suspect_failures`` (K) different jobs (a sweep's tasks are
  one job: one buggy sweep must not condemn a node) fall within ``nodes.suspect_window_s`` of each other;
* it is excluded until ``nodes.exclusion_s`` after the failure that made it one; ``orch nodes --clear``
  ends that sooner (the failures before the clear are forgotten);
* a job is never made unschedulable: when excluding the suspects would leave its partition fewer usable
  nodes than the job asks for, or the partition's nodes cannot be listed, nothing is excluded for that
  attempt and a warning says why (``choose_exclusion``).

The evidence is the job table itself (``attempts.nodes`` + class + end time); only the clears are stored
(table ``node_clears``, migration 0008). The functions above the DB section are pure and unit-tested.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from orchestrator.protocol import FailureClass

if TYPE_CHECKING:
    from orchestrator.backends.base import Backend, Resources, SubmitSpec
    from orchestrator.core.config import Config
    from orchestrator.core.db import Database

# The classes a bad node causes. Not PREEMPTED/TIMEOUT/CANCELLED (the scheduler's decision), not OOM/NAN/
# INVALID/INPUT_MISSING (the program's own), not UNKNOWN (too little is known to blame a node).
SUSPECT_CLASSES = frozenset({FailureClass.CRASH, FailureClass.NODE_FAIL, FailureClass.HANG, FailureClass.KILLED})
MAX_HOSTS = 100_000  # a node list longer than this is refused (x[0-999999999] would exhaust memory)
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_PART_RE = re.compile(r"([^\[\]]*)(?:\[([^\[\]]*)\])?")


# ------------------------------------------------------------------------------------------
# pure: hostlists, the rule, the never-unschedulable choice
# ------------------------------------------------------------------------------------------
def _split_top(spec: str) -> list[str]:
    """Split at commas outside brackets: ``gpu[01-02],cpu5`` -> ``gpu[01-02]``, ``cpu5``."""
    out, depth, cur = [], 0, ""
    for ch in spec:
        depth += (ch == "[") - (ch == "]")
        if depth < 0 or depth > 1:
            raise ValueError(f"unbalanced brackets in node list {spec!r}")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError(f"unbalanced brackets in node list {spec!r}")
    return out + [cur]


def _range_values(body: str, spec: str) -> list[str]:
    """``01-03,07`` -> ``01 02 03 07`` (zero padding kept: Slurm pads to the lower bound's width)."""
    vals: list[str] = []
    for piece in body.split(","):
        lo, _, hi = piece.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise ValueError(f"bad range {piece!r} in node list {spec!r}")
        a, b = int(lo), int(hi or lo)
        if len(vals) + b - a + 1 > MAX_HOSTS:
            raise ValueError(f"node list {spec!r} names more than {MAX_HOSTS} nodes")
        vals += [str(n).zfill(len(lo)) for n in range(a, b + 1)]
    return vals


def expand_hostlist(spec: str) -> list[str]:
    """Slurm's compressed node list (``gpu[01-03,07]``, ``a[1-2]-b[08-09]``, ``c1,c2``) -> node names, in
    order. ValueError for anything else (sacct's ``None assigned`` of a job that never started, too)."""
    names: list[str] = []
    for item in _split_top((spec or "").strip()):
        parts = [(m.group(1), m.group(2)) for m in _PART_RE.finditer(item) if m.group(0)]
        if not parts:
            raise ValueError(f"empty name in node list {spec!r}")
        choices = []
        for text, body in parts:
            choices.append([text])
            if body is not None:
                choices.append(_range_values(body, spec))
        for combo in itertools.product(*choices):
            name = "".join(combo)
            if not NODE_NAME_RE.match(name):
                raise ValueError(f"{name!r} in node list {spec!r} is not a node name")
            names.append(name)
            if len(names) > MAX_HOSTS:
                raise ValueError(f"node list {spec!r} names more than {MAX_HOSTS} nodes")
    return names


@dataclass(frozen=True)
class Failure:
    """One attempt that ended with a class in ``SUSPECT_CLASSES`` (or any class: others are ignored)."""

    job: str
    group: str  # what counts as one job: the job, or its sweep
    attempt: int
    cls: FailureClass
    at: datetime  # when it ended
    nodes: str  # its node list as recorded (compressed)

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "attempt": self.attempt, "class": str(self.cls), "at": self.at.isoformat(),
                "nodes": self.nodes}


@dataclass(frozen=True)
class Rule:
    """K failures of different jobs within ``window_s`` -> excluded for ``exclusion_s``; K = 0: off."""

    failures: int
    window_s: float
    exclusion_s: float

    @classmethod
    def of(cls, cfg: Config) -> Rule:
        return cls(cfg.suspect_failures, cfg.suspect_window_s, cfg.exclusion_s)


@dataclass(frozen=True)
class Suspect:
    node: str
    until: datetime  # excluded until then (unless cleared)
    evidence: list[Failure] = field(default_factory=list)  # the failures in the window that made it one

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "excluded_until": self.until.isoformat(),
                "jobs": sorted({f.job for f in self.evidence}), "evidence": [f.as_dict() for f in self.evidence]}


def _by_node(failures: Iterable[Failure], clears: Mapping[str, datetime]) -> dict[str, list[Failure]]:
    out: dict[str, list[Failure]] = {}
    for f in failures:
        if f.cls not in SUSPECT_CLASSES:
            continue
        try:
            nodes = expand_hostlist(f.nodes)
        except ValueError:
            continue  # an unreadable record blames no node
        for n in dict.fromkeys(nodes):
            if n not in clears or f.at > clears[n]:  # a clear forgets what came before it
                out.setdefault(n, []).append(f)
    return out


def find_suspects(failures: Iterable[Failure], rule: Rule, now: datetime,
                  clears: Mapping[str, datetime] | None = None) -> dict[str, Suspect]:
    """Node -> Suspect for every node excluded at ``now`` under ``rule`` (see the module docstring)."""
    if rule.failures <= 0:
        return {}
    window, hold = timedelta(seconds=rule.window_s), timedelta(seconds=rule.exclusion_s)
    out: dict[str, Suspect] = {}
    for node, fs in _by_node(failures, clears or {}).items():
        fs.sort(key=lambda f: f.at)
        for i in range(len(fs) - 1, -1, -1):  # the newest failure that completes K is what counts
            t = fs[i].at
            inside = [f for f in fs[: i + 1] if f.at > t - window]
            if len({f.group for f in inside}) >= rule.failures:
                if now < t + hold:
                    out[node] = Suspect(node, t + hold, inside)
                break
    return out


def choose_exclusion(suspects: Iterable[str], usable: frozenset[str] | None,
                     needed: int, own: str | None = None) -> tuple[list[str], str | None]:
    """The nodes to exclude for one attempt that needs ``needed`` nodes, and a warning when suspects are
    let through. ``usable``: the partition's usable nodes (a pinned job's: those of its pin), None when they
    could not be listed; ``own``: the job's own option choosing its nodes, if any.

    Never unschedulable: a one-node partition whose node is a suspect, or one where the exclusion would
    leave fewer than ``needed`` nodes, keeps every node (a job pending forever is worse than a retry on a
    suspect node; the policy's retries and backoff still apply). A job that chooses its own nodes keeps its
    choice: sbatch gets no exclusion of orch's then, so none is computed or claimed.
    """
    wanted = sorted(set(suspects))
    if not wanted:
        return [], None
    if own is not None:  # a 2-node pin with one suspect: the exclusion was computed, then dropped unsaid
        hit = [n for n in wanted if usable is None or n in usable]
        return [], (f"not excluding suspect node(s) {','.join(hit)}: the job chooses its own nodes ({own})"
                    if hit else None)
    if usable is None:
        return [], f"not excluding suspect node(s) {','.join(wanted)}: cannot list the partition's nodes"
    hit = [n for n in wanted if n in usable]
    left = len(usable) - len(hit)
    if left < needed:
        return [], (f"not excluding suspect node(s) {','.join(hit)}: the partition has {len(usable)} "
                    f"node{'s' if len(usable) != 1 else ''} and the job needs {needed}")
    return hit, None


# ------------------------------------------------------------------------------------------
# the DB: evidence from attempts, clears from node_clears
# ------------------------------------------------------------------------------------------
def failures_select(backend: str, since: datetime):  # a sqlalchemy Select, imported lazily
    """The attempts of ``backend`` that ended in a suspect class at or after ``since`` with a node list."""
    from sqlalchemy import select

    from orchestrator.core.models import Attempt, Job, Sweep

    return (select(Job.name, Job.sweep_id, Sweep.name, Attempt.n, Attempt.failure_class, Attempt.ended_at,
                   Attempt.nodes)
            .join(Job, Attempt.job_id == Job.id).outerjoin(Sweep, Job.sweep_id == Sweep.id)
            .where(Attempt.backend == backend, Attempt.failure_class.in_(SUSPECT_CLASSES),
                   Attempt.ended_at >= since, Attempt.nodes.is_not(None)))


def failures_of(rows: Iterable[tuple[Any, ...]]) -> list[Failure]:
    """``failures_select``'s rows as failures (the class as a FailureClass or its stored string)."""
    return [Failure(job=name, group=f"sweep:{sweep}" if sweep_id is not None else f"job:{name}", attempt=n,
                    cls=FailureClass(cls), at=_aware(ended), nodes=nodes)
            for name, sweep_id, sweep, n, cls, ended, nodes in rows]


def load_failures(db: Database, backend: str, since: datetime) -> list[Failure]:
    with db.read() as s:
        return failures_of(s.execute(failures_select(backend, since)).all())


def clears_select(backend: str):  # a sqlalchemy Select, imported lazily
    """node -> its latest clear, on ``backend``."""
    from sqlalchemy import func, select

    from orchestrator.core.models import NodeClear

    return (select(NodeClear.node, func.max(NodeClear.cleared_at))
            .where(NodeClear.backend == backend).group_by(NodeClear.node))


def load_clears(db: Database, backend: str) -> dict[str, datetime]:
    """node -> its latest clear."""
    with db.read() as s:
        return {node: _aware(at) for node, at in s.execute(clears_select(backend)).all()}


def current_suspects(db: Database, cfg: Config, backend: str, now: datetime | None = None) -> dict[str, Suspect]:
    """The nodes ``backend`` should keep new attempts off now."""
    return suspects_from(cfg, lambda since: load_failures(db, backend, since), lambda: load_clears(db, backend), now)


def suspects_from(cfg: Config, failures_since: Callable[[datetime], list[Failure]],
                  clears: Callable[[], dict[str, datetime]], now: datetime | None = None) -> dict[str, Suspect]:
    """``current_suspects`` with the evidence from ``failures_since(since)`` and ``clears()`` (``orch submit``'s
    quick path reads them on stdlib sqlite3)."""
    rule = Rule.of(cfg)
    if rule.failures <= 0:
        return {}
    now = now or _now()
    since = now - timedelta(seconds=rule.window_s + rule.exclusion_s)
    failures = failures_since(since)
    if not failures:  # no evidence, no suspect: every submit asks, and most find none (one query less)
        return {}
    return find_suspects(failures, rule, now, clears())


def clear(db: Database, cfg: Config, backend: str, node: str) -> Suspect:
    """End ``node``'s exclusion now. UsageError (nothing written) for a name that is not a suspect."""
    from orchestrator.core.models import NodeClear, utcnow
    from orchestrator.errors import UsageError

    if not NODE_NAME_RE.match(node or ""):
        raise UsageError(f"--clear {node!r}: not a node name")
    suspect = current_suspects(db, cfg, backend).get(node)
    if suspect is None:
        raise UsageError(f"--clear {node}: not an excluded node (orch nodes lists them)")
    with db.write() as s:
        s.add(NodeClear(node=node, backend=backend, cleared_at=utcnow()))
    return suspect


def node_backends() -> list[str]:
    """The backends that can exclude nodes (asked by capability, never by name)."""
    from orchestrator.backends import BACKENDS, get_backend

    return [b for b in BACKENDS if get_backend(b).capabilities.node_exclusion]


def all_suspects(db: Database, cfg: Config) -> list[dict[str, Any]]:
    """Every excluded node of every backend that can exclude nodes, with its evidence (``orch nodes``)."""
    rows = []
    for b in node_backends():
        rows += [dict(s.as_dict(), backend=b) for _, s in sorted(current_suspects(db, cfg, b).items())]
    return rows


def clear_anywhere(db: Database, cfg: Config, node: str) -> None:
    """``orch nodes --clear``: end ``node``'s exclusion on the backend that excludes it. UsageError (nothing
    written) when no backend does."""
    from orchestrator.errors import UsageError

    if not NODE_NAME_RE.match(node or ""):
        raise UsageError(f"--clear {node!r}: not a node name")
    for b in node_backends():
        if node in current_suspects(db, cfg, b):
            clear(db, cfg, b, node)
            return
    raise UsageError(f"--clear {node}: not an excluded node (orch nodes lists them)")


def exclusion_for(db: Database, cfg: Config, backend: Backend, resources: Resources) -> tuple[str, ...]:
    """The nodes a new attempt with ``resources`` should exclude on ``backend`` (empty where the backend
    cannot exclude nodes, the rule is off, or excluding would leave the job unschedulable)."""
    if not excludes_nodes(cfg, backend):
        return ()
    return exclusion_among(current_suspects(db, cfg, backend.name), backend, resources)


def excludes_nodes(cfg: Config, backend: Backend) -> bool:
    """Whether attempts on ``backend`` are kept off suspect nodes at all."""
    return backend.capabilities.node_exclusion and cfg.suspect_failures > 0


def exclusion_among(suspects: Mapping[str, Suspect], backend: Backend, resources: Resources) -> tuple[str, ...]:
    """Of ``suspects``, the nodes to exclude for ``resources`` (never all a job could run on: then none)."""
    if not suspects:
        return ()  # the common case: no scheduler query at all
    exclude, warning = choose_exclusion(suspects, backend.usable_nodes(resources), resources.nodes or 1,
                                        backend.own_node_choice(resources))
    if warning:
        print(f"orch: warning: {warning}", file=sys.stderr)
    return tuple(exclude)


def with_exclusion(db: Database, cfg: Config, backend: Backend, spec: SubmitSpec) -> SubmitSpec:
    """``spec`` with the nodes it must avoid (unchanged where nothing is excluded)."""
    exclude = exclusion_for(db, cfg, backend, spec.resources)
    return dataclasses.replace(spec, exclude_nodes=exclude) if exclude else spec


def _now() -> datetime:
    from orchestrator.core.states import utcnow

    return _aware(utcnow())


def _aware(t: datetime) -> datetime:
    """DB times are naive UTC on SQLite: compare them as aware UTC."""
    from datetime import UTC

    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)
