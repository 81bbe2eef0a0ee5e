"""orchestrator.ops.reconcile: one pass at a time through the DB lease (fencing, not timers: a second reconciler
skips, a dead holder's lease expires), and a pass stores its stats for ``orch metrics`` as it releases it.
Concurrent reconcilers end to end: tests/local/test_concurrency.py."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from orchestrator.core.lifecycle import utcnow
from orchestrator.core.models import Lease
from orchestrator.ops.reconcile import LEASE, acquire_lease, reconcile_pass, release_lease


def test_the_lease_has_one_holder_until_released_then_the_next_takes_it(db, cfg):
    assert acquire_lease(db, cfg, "host-a:1") is True
    assert acquire_lease(db, cfg, "host-b:2") is False  # a second reconciler skips its pass
    assert acquire_lease(db, cfg, "host-a:1") is True  # the holder renews its own
    release_lease(db, "host-a:1")
    assert acquire_lease(db, cfg, "host-b:2") is True


def test_a_dead_holders_lease_is_taken_once_it_expired(db, cfg):
    assert acquire_lease(db, cfg, "host-a:1") is True
    with db.write() as s:  # the holder died mid-pass: its lease runs out, nobody releases it
        s.get(Lease, LEASE).expires_at = utcnow() - timedelta(seconds=1)
    assert acquire_lease(db, cfg, "host-b:2") is True
    assert acquire_lease(db, cfg, "host-a:1") is False  # back from the dead: the lease is no longer its own


def test_a_pass_while_another_holds_the_lease_does_nothing(db, cfg, sched):
    long_ttl = dataclasses.replace(cfg, lease_ttl_s=600)
    assert acquire_lease(db, long_ttl, "elsewhere:1") is True
    rep = reconcile_pass(db, long_ttl, lambda _n: sched)
    assert rep.ran is False and rep.polled == 0
    release_lease(db, "elsewhere:1")
    rep = reconcile_pass(db, long_ttl, lambda _n: sched)
    assert rep.ran is True
