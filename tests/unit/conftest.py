"""Unit-test fixtures: an in-process Config + Database on a private ORCH_HOME (real SQLite file, or a real
PostgreSQL database for tests marked ``each_db``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.config import Config, load_config
from orchestrator.core.db import Database


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_url: str | None) -> Config:
    """SQLite in ORCH_HOME; in a ``postgres`` variant (``each_db``), ORCH_DB_URL as the db_url fixture set it."""
    for k in ("ORCH_HOME", "ORCH_FAULT", "ORCH_LAUNCH_GRACE_S"):
        monkeypatch.delenv(k, raising=False)
    return load_config(tmp_path / "orch-home")


@pytest.fixture
def db(cfg: Config) -> Database:
    d = Database(cfg)
    yield d
    d.engine.dispose()


@pytest.fixture
def sched(monkeypatch: pytest.MonkeyPatch):  # orchkit's FakeScheduler
    """The shared fake scheduler (tests/orchkit.py) behind every service that looks a backend up by name."""
    from orchkit import fake_scheduler, use_backend

    s = fake_scheduler()
    use_backend(monkeypatch, s)
    monkeypatch.setattr("orchestrator.ops.sweep.get_backend", lambda _name: s)
    monkeypatch.setattr("orchestrator.backends.get_backend", lambda _name: s)  # show.log_paths' live probe
    return s


@pytest.fixture
def outside(tmp_path):
    """A tree outside ORCH_HOME that confinement tests check is never touched (rundir, trash)."""
    o = tmp_path / "outside"
    (o / "sub").mkdir(parents=True)
    (o / "sub" / "secret").write_text("never touched\n")
    return o
