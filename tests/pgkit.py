"""The real PostgreSQL server of the ``postgres`` test variants (deploy/postgres/pg.sh).

Tests marked ``@pytest.mark.each_db`` run twice: on SQLite (orch's default) and on a fresh database
of this server, created with ``CREATE DATABASE`` for the one test and dropped after it. The server is
the one ``pg.sh up`` starts (scripts/test.sh does it before pytest), or any server named by
``ORCH_TEST_PG_URL`` (a URL whose role may create databases). With ``CI=true`` a server that cannot be
reached or started FAILS the variant; elsewhere it skips with the reason.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PG_SH = ROOT / "deploy" / "postgres" / "pg.sh"
from orchkit import IN_CI  # noqa: E402,F401 - the one reading of CI=true


class Unavailable(Exception):
    """No server for the variant; the message says why and what to run."""


def _pg_sh(cmd: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(PG_SH), cmd], capture_output=True, text=True, timeout=timeout)


def _answers(url: str) -> bool:
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError

    engine = create_engine(url, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as c:
            c.execute(text("SELECT 1"))
        return True
    except OperationalError:
        return False
    finally:
        engine.dispose()


def start_server() -> tuple[str, bool]:
    """(URL of the server's own database, whether this call started the server)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise Unavailable("the PostgreSQL driver is not installed (pip install -e '.[postgres]')") from None
    if url := os.environ.get("ORCH_TEST_PG_URL"):
        if not _answers(url):
            raise Unavailable(f"ORCH_TEST_PG_URL names a server that does not answer: {url.split('@')[-1]}")
        return url, False
    url = _pg_sh("url").stdout.strip()
    if _pg_sh("status").returncode == 0 and _answers(url):
        return url, False
    if os.geteuid() != 0:
        raise Unavailable("the test PostgreSQL server is not running and only root can start it "
                          "(deploy/postgres/pg.sh up), or set ORCH_TEST_PG_URL")
    p = _pg_sh("up")
    if p.returncode != 0:
        raise AssertionError(f"deploy/postgres/pg.sh up failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout.strip(), True


def stop_server() -> None:
    _pg_sh("down", timeout=60)


@contextlib.contextmanager
def fresh_database(server_url: str) -> Iterator[str]:
    """A new, empty database on the server for one test; its URL. Dropped afterwards (with any
    connection a killed orch process left)."""
    from sqlalchemy import create_engine, make_url, text

    name = f"orch_test_{secrets.token_hex(6)}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def rows(url: str, sql: str, params: Sequence[object] = ()) -> list[tuple]:
    """``sql`` (with ``?`` placeholders, as sqlite3 takes them) on the database at ``url``."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as c:
            return [tuple(r) for r in c.exec_driver_sql(sql.replace("%", "%%").replace("?", "%s"), tuple(params))]
    finally:
        engine.dispose()
