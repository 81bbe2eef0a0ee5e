"""Unit-test fixtures: an in-process Config + Database on a private ORCH_HOME (real SQLite file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import Config, load_config
from orchestrator.db import Database


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    for k in ("ORCH_DB_URL", "ORCH_HOME", "ORCH_FAULT", "ORCH_LAUNCH_GRACE_S"):
        monkeypatch.delenv(k, raising=False)
    return load_config(tmp_path / "orch-home")


@pytest.fixture
def db(cfg: Config) -> Database:
    d = Database(cfg)
    yield d
    d.engine.dispose()
