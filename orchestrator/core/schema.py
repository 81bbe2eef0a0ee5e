"""The schema revision this orch's code reads and writes: Alembic's head (tests/unit/test_migrations.py).

One constant for both paths to the job table: ``db`` (SQLAlchemy) upgrades a DB to it, and ``quickdb`` (stdlib
sqlite3, the quick path) goes through its gate only for a DB already at it. Stdlib only: the quick path imports it.
"""

SCHEMA_HEAD = "0014"
