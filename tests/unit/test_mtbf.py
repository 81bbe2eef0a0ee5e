"""The history behind ORCH_MTBF_S (orchestrator/decide/mtbf.py): which ended attempts count for a partition."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text


def _ended(db, name: str, backend: str, resources: object, cls: str | None, held_s: float | None, ago_s: float) -> None:
    """A job with one ended attempt (raw rows, as any orch version left them)."""
    end = datetime.now(UTC).replace(tzinfo=None) - timedelta(seconds=ago_s)
    start = None if held_s is None else end - timedelta(seconds=held_s)
    with db.write() as s:
        jid = s.execute(text(
            "INSERT INTO jobs (name, state, backend, run_dir, command_json, resources_json, outputs_json, "
            "max_attempts, overrides_json, auto_requeue, created_at, updated_at) "
            "VALUES (:n, 'failed', :b, '/x', '[]', :r, '[]', 3, '{}', false, :t, :t) RETURNING id"),
            {"n": name, "b": backend, "r": resources, "t": end}).scalar_one()
        s.execute(text(
            "INSERT INTO attempts (job_id, n, token, state, backend, overrides_json, counted, restarts, "
            "created_at, started_at, ended_at, failure_class, fence) "
            "VALUES (:j, 1, :tok, 'failed', :b, '{}', true, 0, :t, :s, :e, :c, 1)"),
            {"j": jid, "tok": "tok-" + name, "b": backend, "t": end, "s": start, "e": end, "c": cls})


def _history(s, backend: str, part: str) -> tuple[float, int]:
    from datetime import UTC, datetime

    from orchestrator.decide import mtbf

    cutoff = datetime.now(UTC).replace(tzinfo=None) - mtbf.WINDOW
    return mtbf.fold_history(s.connection().execute(mtbf.history_select(backend, cutoff)), backend, part)


@pytest.mark.each_db
def test_only_the_partitions_attempts_of_the_window_count_whatever_else_their_resources_hold(db):
    """The history is read once per submit, and decoding every row's resources was most of it (50 ms
    for 10,000 attempts); each distinct resources text is decoded once now. Same-partition rows with different
    resources, with the same text, rows of other partitions / backends / no partition, a
    failure never seen running (no started_at) and one outside the window."""
    from orchestrator.decide import mtbf

    spot, spot_big = json.dumps({"partition": "spot"}), json.dumps({"partition": "spot", "gpus": 8})
    _ended(db, "a", "slurm", spot, "killed", 100, 60)
    _ended(db, "b", "slurm", spot, "preempted", 200, 60)  # a signalled end: held time, no failure
    _ended(db, "c", "slurm", spot_big, "oom", 400, 60)
    _ended(db, "d", "slurm", spot_big, "node_fail", None, 60)  # never seen running: a failure, no held time
    _ended(db, "e", "slurm", json.dumps({"partition": "gpu"}), "killed", 800, 60)
    _ended(db, "f", "slurm", json.dumps({}), "killed", 1600, 60)
    _ended(db, "h", "local", spot, "killed", 6400, 60)
    _ended(db, "i", "slurm", spot, "killed", 12800, mtbf.WINDOW.total_seconds() + 3600)
    with db.read() as s:
        assert _history(s, "slurm", "slurm/spot") == (700.0, 3)
        assert _history(s, "slurm", "slurm/gpu") == (800.0, 1)
        assert _history(s, "slurm", "slurm/-") == (1600.0, 1)  # no partition
        assert _history(s, "local", "local/spot") == (6400.0, 1)
