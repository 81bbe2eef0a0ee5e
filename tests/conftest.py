"""Fixtures shared by all test folders: a private ORCH_HOME per test, `orch` run as a user would, and
the DB under it: SQLite in ORCH_HOME, or, for tests marked ``each_db``, also a fresh database of a real
PostgreSQL server (the test runs once per DB; tests/pgkit.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pgkit
import pytest
from orchkit import tree_hash  # noqa: F401 - re-exported for tests that use it

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


@dataclass
class Orch:
    """Runs `python -m orchestrator.cli` in a subprocess with this test's ORCH_HOME."""

    home: Path
    env: dict

    @property
    def runs(self) -> Path:
        return self.home / "runs"

    def __call__(self, *args: str, timeout: float = 120, env: dict | None = None,
                 check: bool = False) -> subprocess.CompletedProcess:
        p = subprocess.run([PY, "-m", "orchestrator.cli", *map(str, args)], capture_output=True, text=True,
                           timeout=timeout, env={**self.env, **(env or {})}, cwd=str(ROOT))
        if check and p.returncode != 0:
            raise AssertionError(f"orch {' '.join(map(str, args))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        return p

    def json(self, *args: str, **kw) -> object:
        p = self(*args, "--json", check=True, **kw)
        return json.loads(p.stdout)

    def show(self, name: str) -> dict:
        return self.json("show", name)

    def state(self, name: str) -> str:
        return self.show(name)["state"]

    def wait(self, name: str, states: set[str], timeout: float = 120, reconcile: bool = True) -> str:
        """Reconcile until the job reaches one of `states`; fail with its history otherwise."""
        t0 = time.time()
        st = None
        while time.time() - t0 < timeout:
            if reconcile:
                self("reconcile", check=True)
            st = self.state(name)
            if st in states:
                return st
            time.sleep(0.5)
        raise AssertionError(f"{name} still {st} after {timeout}s; wanted {states}: {self.show(name)}")

    def write_config(self, text: str) -> None:
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.home / "orch.toml").write_text(text)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``each_db`` that uses the DB (through ``orch``, ``db_url`` or ``db_kind``) runs
    once on SQLite and once on PostgreSQL, the same body (``-k postgres`` picks the latter);
    ``each_db(only="postgres")``: a PostgreSQL behaviour, tested there only."""
    mark = metafunc.definition.get_closest_marker("each_db")
    if mark and "db_kind" in metafunc.fixturenames:
        metafunc.parametrize("db_kind", [mark.kwargs["only"]] if "only" in mark.kwargs else ["sqlite", "postgres"],
                             indirect=True)


@pytest.fixture
def db_kind(request: pytest.FixtureRequest) -> str:
    return getattr(request, "param", "sqlite")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The URL of the test PostgreSQL server (started when root and not running; stopped again then)."""
    try:
        url, started = pgkit.start_server()
    except pgkit.Unavailable as e:
        if pgkit.IN_CI:
            pytest.fail(f"{e} (CI=true: the PostgreSQL tests must run)", pytrace=False)
        pytest.skip(f"{e}; CI is not set")
    yield url
    if started:
        pgkit.stop_server()


@pytest.fixture
def db_url(db_kind: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str | None]:
    """None on SQLite (orch's own file in ORCH_HOME); on PostgreSQL a fresh database's URL. Either way
    ORCH_DB_URL in this process says the same, so in-process orch code and db_rows use that DB."""
    if db_kind == "sqlite":
        monkeypatch.delenv("ORCH_DB_URL", raising=False)
        yield None
        return
    with pgkit.fresh_database(request.getfixturevalue("pg_server")) as url:
        monkeypatch.setenv("ORCH_DB_URL", url)
        yield url
        # A variant that never reached this database tested nothing on PostgreSQL.
        assert pgkit.rows(url, "SELECT to_regclass('alembic_version') IS NOT NULL") == [(True,)], \
            "orch never created its schema in this test's PostgreSQL database"


@pytest.fixture
def orch(tmp_path: Path, db_url: str | None) -> Orch:
    home = tmp_path / "orch-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "SLURM_"))}
    env.update(ORCH_HOME=str(home), PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    if db_url:
        env["ORCH_DB_URL"] = db_url
    return Orch(home=home, env=env)
