"""Settle ended attempts' tallies into the running totals (``fleet_tallies``, migration 0014), a bounded batch per
reconcile pass.

``orch metrics`` reads the totals and the run dirs only of the attempts not settled yet (the live ones and those
ended since the last pass): counting every attempt and measuring every preemption in history from its heartbeat files
took 7.3 s at 100,000 jobs, on every pass that exports the textfile. A tally is final once the attempt ended (its files
and its predecessor's no longer change), so it is computed once. Each attempt is marked settled by a compare-and-set
on its row being unsettled, and only the attempts this transaction marked are added, in the same transaction: a
second reconciler (or a pass racing an older one) never counts one twice, and a crash leaves both or neither.
"""

from __future__ import annotations

from sqlalchemy import bindparam, select, update

from orchestrator.core.db import Database
from orchestrator.core.models import Attempt, FleetTally
from orchestrator.views.tally import attempt_tally, unsettled_select

# At most this many attempts settled per pass: the first passes after the upgrade settle a big history in batches,
# none of them stalled (each costs up to two heartbeat reads per attempt: 0.1-0.3 s for 5,000 here).
SETTLE_BATCH = 5_000
CHUNK = 500  # ids per IN list (SQLite's bound-parameter limit was 999 before 3.32)


def settle_tallies(db: Database, limit: int = SETTLE_BATCH) -> int:
    """Add the tallies of up to ``limit`` ended, unsettled attempts to the running totals; how many this call
    settled. The files are read outside any transaction; the write holds the DB only for the updates."""
    with db.read() as s:
        rows = s.execute(unsettled_select(ended_only=True, limit=limit)).all()
    if not rows:
        return 0
    tallied = {row[0]: (attempt_tally(*row[1:]), row[5]) for row in rows}
    c = Attempt.__table__.c
    totals: dict[str, int] = {}
    with db.write() as s:
        # Which are still unsettled, locked (PostgreSQL; SQLite's write transaction already excludes every other
        # writer): another pass may have settled some since the read above, and counted them.
        ids = sorted(tallied)
        still = [i for k in range(0, len(ids), CHUNK) for i in s.scalars(
            select(c.id).where(c.id.in_(ids[k:k + CHUNK]), c.redone_count.is_(None)).with_for_update())]
        if not still:
            return 0
        marks = []
        for attempt_id in still:
            t, restarts = tallied[attempt_id]
            marks.append({"attempt_id": attempt_id, "sum": sum(t.redone), "count": len(t.redone),
                          "unmeasured": t.unmeasured, "classes": list(t.classes) if restarts else None})
            for k, v in t.counts().items():
                totals[k] = totals.get(k, 0) + v
        s.execute(update(Attempt.__table__).where(c.id == bindparam("attempt_id"), c.redone_count.is_(None))
                  .values(redone_sum=bindparam("sum"), redone_count=bindparam("count"),
                          redone_unmeasured=bindparam("unmeasured"), restart_classes_json=bindparam("classes")),
                  marks, execution_options={"synchronize_session": False})
        for name, add in sorted(totals.items()):  # one order, so two writers lock rows alike (PostgreSQL)
            if not s.execute(update(FleetTally).where(FleetTally.name == name)
                             .values(value=FleetTally.value + add)).rowcount:
                s.add(FleetTally(name=name, value=add))
    return len(still)
