"""Fixtures shared by all test folders: a private ORCH_HOME per test, `orch` run as a user would, and
the DB under it: SQLite in ORCH_HOME, or, for tests marked ``each_db``, also a fresh database of a real
PostgreSQL server (the test runs once per DB; tests/pgkit.py).

Also the tiers: every test is marked by what it needs (``slurm``, ``postgres``, ``e2e``), and the tests that
need none of them are marked ``quick`` (``bash scripts/test.sh --quick``, or ``pytest -m quick``), with the
one end-to-end run the quick tier keeps. Each test is bounded (pytest-timeout; CONTRIBUTING.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pgkit
import pytest
from orchkit import Orch, orch_for, tree_hash  # noqa: F401 - re-exported for tests that use them

TESTS = Path(__file__).resolve().parent
# Folders whose tests run real programs end to end (orch's CLI, job wrappers, the trainer, torchrun ranks):
# seconds to minutes each. tests/policy runs real trainer jobs too, but the quick tier keeps its flows.
E2E_FOLDERS = frozenset({"local", "integrations", "trainer", "adversarial", "reliability", "bench", "packaging",
                         "docs", "browser"})
# Unit and policy tests run in one process or start a few short jobs: one still running after this is
# hung (the slowest takes ~20 s here). Elsewhere pyproject's default holds; a test proving a bound marks its own.
FOLDER_TIMEOUT_S = {"unit": 120, "policy": 240}


def _folder(item: pytest.Item) -> str:
    """The folder under tests/ that holds ``item`` ('' for a test directly in tests/)."""
    rel = Path(str(item.fspath)).resolve().relative_to(TESTS)
    return rel.parts[0] if len(rel.parts) > 1 else ""


def _needs_postgres(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    on_pg = callspec is not None and callspec.params.get("db_kind") == "postgres"
    return on_pg or "pg_server" in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the marks set here select the tiers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks each test by what it needs, and ``quick`` where it needs nothing slow; sets folder timeouts."""
    for item in items:
        folder = _folder(item)
        if folder == "slurm":
            item.add_marker(pytest.mark.slurm)
        if _needs_postgres(item):
            item.add_marker(pytest.mark.postgres)
        if folder in E2E_FOLDERS:
            item.add_marker(pytest.mark.e2e)
        needs = {m.name for m in item.iter_markers()} & {"slurm", "postgres", "e2e", "long"}
        if not needs and item.get_closest_marker("quick") is None:
            item.add_marker(pytest.mark.quick)
        if folder in FOLDER_TIMEOUT_S and not needs and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(FOLDER_TIMEOUT_S[folder]))


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
def orch(tmp_path: Path, db_url: str | None) -> Iterator[Orch]:
    home = tmp_path / "orch-home"
    yield orch_for(home, db_url)
    _kill_jobs_under(home)


def _kill_jobs_under(home: Path) -> None:
    """SIGKILL every process that still runs for a job of ``home`` (its command line or environment names it): a
    test that failed before its cancel left four ranks training for 40 minutes, slowing every later CI test."""
    import os
    import signal

    mark = str(home).encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if mark in (d / "cmdline").read_bytes() or mark in (d / "environ").read_bytes():
                os.kill(int(d.name), signal.SIGKILL)
        except OSError:
            continue
