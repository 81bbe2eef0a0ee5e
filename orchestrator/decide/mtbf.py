"""The mean time between unwarned failures orch hands every attempt (``ORCH_MTBF_S``), from the job table.

A job with ``--save-interval auto`` (``orch_run(save_every="auto")``) saves at Daly's interval for its measured
save cost and this M (``orchestrator/kit/interval.py``). M is per backend/partition: the held time of the
attempts that ended there in the last ``WINDOW``, over the failures among them that gave no warning (classes
``killed``, ``node_fail``, ``oom``; a signalled preemption saves on its signal). With the prior M0 weighted as
w = 0.25 of a failure-free stretch ending in a failure (a Gamma prior on the failure rate)::

    M = (H + w·M0) / (n + w)

no history gives M0 (24 h), a clean history grows past it, and failures pull it to about H / n quickly: with
w = 1 a partition failing 4 times an hour kept M near the prior for a day of held time, and the simulated
goodput of its jobs (bench/bench_interval.py, P7d) fell 3-6 pp below the oracle's; with w = 0.25, 0-3 pp.
The SCR library estimates M online the same way but counts every allocation end as a failure; orch counts only
unwarned ones.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from orchestrator.core.goodput import UNSIGNALLED
from orchestrator.core.resources import partition_of
from orchestrator.kit.interval import ENV_MTBF, ENV_MTBF_SOURCE, PRIOR_MTBF_S

WINDOW = timedelta(days=30)
CACHE_S = 60.0  # a sweep's 1,000 launches in one process ask once per partition, not 1,000 times

_cache: dict[tuple[str, str], tuple[float, dict[str, str]]] = {}
_lock = threading.Lock()


PRIOR_WEIGHT = 0.25  # the prior counts as a quarter of an observed failure-free stretch ending in a failure


def estimate_mtbf(held_s: float, failures: int, prior_s: float = PRIOR_MTBF_S, weight: float = PRIOR_WEIGHT) -> float:
    """M = (H + w·M0) / (n + w): the posterior mean of a Gamma(w, w·M0) prior on the failure interval's rate."""
    return (max(0.0, held_s) + weight * prior_s) / (max(0, failures) + weight)


def partition_key(backend: str, resources: Any) -> str:
    part = partition_of(resources)
    return f"{backend}/{part or '-'}"


def mtbf_env(s: Any, backend: str, resources: Any, now: float | None = None) -> dict[str, str]:
    """``ORCH_MTBF_S`` and ``ORCH_MTBF_SOURCE`` for a job on ``backend`` with ``resources`` (a read session ``s``)."""
    return mtbf_env_from(lambda cutoff: s.connection().execute(history_select(backend, cutoff)), backend, resources,
                         now)


def mtbf_env_from(rows_since: Callable[[datetime], Iterable[tuple[Any, ...]]], backend: str, resources: Any,
                  now: float | None = None) -> dict[str, str]:
    """``mtbf_env`` with the history's rows from ``rows_since(cutoff)``: (started_at, ended_at, failure class,
    the job's resources as stored) of ``backend``'s attempts that ended at or after ``cutoff`` (naive UTC), as
    ``history_select`` reads them (``orch submit``'s quick path runs its SQL on stdlib sqlite3)."""
    now = time.time() if now is None else now
    key = (backend, partition_key(backend, resources))
    with _lock:
        hit = _cache.get(key)
        if hit is not None and now - hit[0] < CACHE_S:
            return dict(hit[1])
    cutoff = datetime.fromtimestamp(now, UTC).replace(tzinfo=None) - WINDOW
    held, failures = fold_history(rows_since(cutoff), backend, key[1])
    m = estimate_mtbf(held, failures)
    env = {ENV_MTBF: f"{m:.1f}",
           ENV_MTBF_SOURCE: f"{key[1]}: {failures} unwarned failure(s) in {held / 3600:.2f} h held over "
                            f"{WINDOW.days} days, prior {PRIOR_MTBF_S / 3600:.0f} h"}
    with _lock:
        _cache[key] = (now, env)
    return dict(env)


def history_select(backend: str, cutoff: datetime):  # a sqlalchemy Select, imported lazily
    """The attempts of ``backend`` that ended at or after ``cutoff``, with their job's stored resources."""
    from sqlalchemy import Text, select, type_coerce

    from orchestrator.core.models import Attempt, Job

    # Every submit reads this, and 10,000 ended attempts took 50 ms: decoding each row's resources was
    # 60 % of it (now each distinct JSON text is decoded once; a sweep's tasks share one) and the ORM's row
    # loading most of the rest (Core rows, on the session's own connection and transaction).
    return (select(Attempt.started_at, Attempt.ended_at, Attempt.failure_class, type_coerce(Job.resources, Text))
            .join(Job, Job.id == Attempt.job_id)
            .where(Job.backend == backend, Attempt.ended_at >= cutoff))


def fold_history(rows: Iterable[tuple[Any, ...]], backend: str, part: str) -> tuple[float, int]:
    """(held seconds, unwarned failures) of the rows (``history_select``'s) whose job ran on ``part``."""
    parts: dict[str | None, str] = {}
    held, failures = 0.0, 0
    for started, ended, cls, stored in rows:
        if stored not in parts:
            parts[stored] = partition_key(backend, None if stored is None else json.loads(stored))
        if parts[stored] != part:
            continue
        # started_at is when a pass saw it running: a kill -9 in the first seconds may never have been seen
        # running, and is still a failure (its held time, unknown to the DB, counts as 0)
        held += max(0.0, (ended - started).total_seconds()) if started is not None else 0.0
        failures += getattr(cls, "value", cls) in UNSIGNALLED
    return held, failures
