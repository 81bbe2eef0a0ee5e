"""`orch report`'s quick path (goodputquick): the SQL kept in the source is what the models compile today, and
it reports exactly what the SQLAlchemy path reports from the same rows (a real SQLite DB)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.core.lifecycle import AttemptState, JobState
from orchestrator.core.models import Attempt, Job, Sweep
from orchestrator.protocol import FailureClass
from orchestrator.views import goodputquick, goodputrows
from orchestrator.views.goodputview import report


def test_the_quick_report_runs_the_generated_text_of_the_models_queries_by_their_columns():
    from orchestrator.core.sqlitetext import SQL
    from orchestrator.ops import statements

    for since, windowed in (("", False), ("_since", True)):
        for q, name, keys in zip(goodputrows.report_selects(windowed), ("report_jobs", "report_attempts"),
                                 (goodputrows.JOB_KEYS, goodputrows.ATTEMPT_KEYS), strict=True):
            assert SQL[name + since] == statements.compiled(q)[0]
            assert (":cutoff" in SQL[name + since]) == windowed
            assert keys == tuple(q.selected_columns.keys())


@pytest.mark.each_db  # on PostgreSQL the slow path alone answers: its SQL must run there too
def test_quick_and_slow_paths_report_the_same(cfg, db, tmp_path):
    assert (goodputquick.quick_jobs(cfg, None, 0.0) is None) == (not cfg.db_url.startswith("sqlite"))
    t0 = datetime(2026, 12, 1, 12, 0, 0)
    with db.write() as s:
        sw = Sweep(name="sw", backend="local", params=[{}])
        s.add(sw)
        s.flush()
        for k, (created, cls) in enumerate([(t0, FailureClass.KILLED), (t0 - timedelta(days=30), None)]):
            job = Job(name=f"j{k}", state=JobState.FAILED, backend="slurm", run_dir=str(tmp_path / f"j{k}"),
                      command=["x"], resources={"partition": "spot", "gpus": 2}, created_at=created,
                      sweep_id=sw.id if k == 0 else None, task_index=0 if k == 0 else None)
            s.add(job)
            s.flush()
            began = created.replace(tzinfo=UTC).timestamp() + 10
            # j0: the scheduler accounted two runs of 20 s (an in-place requeue); j1: none, the DB's 60 s
            runs = [[began, began + 20], [began + 40, began + 60]] if k == 0 else None
            s.add(Attempt(job_id=job.id, n=1, token=f"t{k}", state=AttemptState.FAILED, backend="slurm",
                          started_at=created + timedelta(seconds=10), ended_at=created + timedelta(seconds=70),
                          failure_class=cls, restarts=1 if k == 0 else 0, runs=runs))
    now = t0.replace(tzinfo=UTC).timestamp() + 3600  # the DB's times are naive UTC
    for since in (None, timedelta(days=7)):
        slow = report(db, since, now)
        quick = goodputquick.quick_report(cfg, since, now)
        if not cfg.db_url.startswith("sqlite"):
            assert quick is None  # PostgreSQL: always the slow path
            continue
        assert quick == slow
        assert quick["fleet"]["jobs"] == (2 if since is None else 1)
    assert slow["by_partition"]["slurm/spot"]["unsignalled_failures"] == 1
    assert slow["by_sweep"]["sw"]["gpu_seconds"]["failed_attempt"] == pytest.approx(2 * 40)  # two runs of 20 s
    assert report(db, None, now)["fleet"]["held_s"] == pytest.approx(40 + 60)


def test_a_db_at_another_revision_takes_the_slow_path(cfg, db):
    import sqlite3

    from orchestrator.core.config import sqlite_path

    path = sqlite_path(cfg.db_url)
    assert path is not None  # not an each_db test: always SQLite
    assert goodputquick.quick_jobs(cfg, None, 0.0) == []
    with sqlite3.connect(path) as c:  # an older schema: its columns may differ from the SQL kept here
        c.execute("UPDATE alembic_version SET version_num = '0004'")
    assert goodputquick.quick_jobs(cfg, None, 0.0) is None
