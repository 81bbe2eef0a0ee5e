"""Every statement of the quick path (stdlib sqlite3, no SQLAlchemy import), defined once, from the models.

The quick path (``ops/quicksubmit``, ``ops/quicksweep``) cannot import SQLAlchemy: importing it costs more than
``orch submit``'s whole latency goal on a login node. It used to run SQL written by hand, with the models'
defaults retyped as literals, so a column added to a model, a default changed or a state renamed could leave it
writing rows the SQLAlchemy path never would. Now each statement is a SQLAlchemy Core construct here, built from the
models' own tables, columns, defaults and state values, and the SQLite text it compiles to is generated into
``core/sqlitetext.py`` (checked in; ``tests/unit/test_sqlitetext.py`` regenerates it and compares, as
``docs/lifecycle.md`` is checked). Never a cache read at run time.

Parameters are named; an UPDATE's never as a column of its table (SQLAlchemy would take such an execution
parameter for a SET value of its own: tests/unit/test_sqlitetext.py). A parameter given a value here (a state, a
model's default) is a constant: its value, as the column's type stores it, goes into ``sqlitetext.CONSTANTS``, and
``quickdb.run`` binds it with the caller's. The others are the caller's to give, by name; one bound to a JSON
column is given as its value, and ``quickdb.run`` stores it as ``models.JSONType`` does (``sqlitetext.JSON_PARAMS``).
``SessionExecutor`` runs the constructs themselves through SQLAlchemy, on any database (``core/transactions.py``).

    python -m orchestrator.ops.statements --write    # regenerate core/sqlitetext.py
    python -m orchestrator.ops.statements --check    # exit 1 if it is stale
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Column, bindparam, func, insert, select, union_all, update
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql import ClauseElement

from orchestrator import testhooks
from orchestrator.core.generated import write_or_check
from orchestrator.core.models import Attempt, Environment, Event, Job, JSONType, Sweep
from orchestrator.core.states import AttemptState, JobState
from orchestrator.decide import mtbf, suspects

A, J = AttemptState, JobState
TARGET = Path(__file__).resolve().parents[1] / "core" / "sqlitetext.py"


def given(name: str) -> Any:
    """A parameter the caller gives."""
    return bindparam(name)


def const(name: str, value: Any, column: Any) -> Any:
    """A constant, stored as ``column``'s type stores it."""
    return bindparam(name, value=value, type_=column.type)


def default(column: Column) -> Any:
    """``column``'s default in the model (``mapped_column(default=...)``), as a constant."""
    d = column.default
    value = d.arg(None) if d.is_callable else d.arg  # a callable default (dict, list) is wrapped to take a context
    return const(f"default_{column.name}", value, column)


# The statements that create a row in a state or move one: (the lifecycle kind, the state), as lifecycle.py's tables
# say it; tests/unit/test_lifecycle_data.py holds them to writing exactly these, and each caller to a declared edge.
MOVES: dict[str, tuple[str, Any]] = {
    "new_job": ("job birth", J.PENDING),
    "new_attempt": ("attempt birth", A.PENDING),
    "claim": ("attempt", A.LAUNCHING),
    "record": ("attempt", A.SUBMITTED),
    "job_submitted": ("job", J.SUBMITTED),
}


def _statements(dialect: str = "sqlite") -> dict[str, Callable[[], ClauseElement]]:
    """Each statement's builder; ``dialect`` (SQLite's or PostgreSQL's) only for an insert that tolerates a
    duplicate, which SQLAlchemy spells per database."""
    # the read views' queries: imported here, not by every command that imports this module for its executor
    from orchestrator.views.goodputrows import report_selects
    from orchestrator.views.metrics import metrics_selects
    from orchestrator.views.status import count_select, status_select

    at, jt = Attempt.__table__.c, Job.__table__.c
    launching = const("launching", A.LAUNCHING, at.state)

    def names_taken() -> ClauseElement:
        return union_all(select(Job.name).where(Job.name == given("name")),
                         select(Sweep.name).where(Sweep.name == given("name")))

    def any_names_taken() -> ClauseElement:
        # a sweep's names, one JSON list parameter (SQLite's json_each; quickdb's gate checks it is there): an IN
        # of bound names needs one parameter per name, past SQLite's limit for a large sweep
        names = select(func.json_each(bindparam("names", type_=JSONType)).table_valued("value").c.value)
        return union_all(select(Job.name).where(Job.name.in_(names)), select(Sweep.name).where(Sweep.name.in_(names)))

    def new_job() -> ClauseElement:
        return insert(Job.__table__).values(
            name=given("name"), state=const("pending", J.PENDING, jt.state), backend=given("backend"),
            run_dir=given("run_dir"), command_json=given("command_json"), resources_json=given("resources_json"),
            outputs_json=given("outputs_json"), max_attempts=given("max_attempts"),
            overrides_json=default(jt.overrides_json), auto_requeue=default(jt.auto_requeue),
            created_at=given("now"), updated_at=given("now"), env_id=given("env_id"), sweep_id=given("sweep_id"),
            task_index=given("task_index"))

    def new_attempt() -> ClauseElement:
        # a job's first attempt (``lifecycle.create_attempt``'s n for a new job)
        return insert(Attempt.__table__).values(
            job_id=given("job_id"), n=const("first", 1, at.n), token=given("token"),
            state=const("pending", A.PENDING, at.state), backend=given("backend"),
            overrides_json=default(at.overrides_json), counted=default(at.counted), restarts=default(at.restarts),
            fence=default(at.fence), rank_restarts=default(at.rank_restarts), created_at=given("now"))

    def claim() -> ClauseElement:
        # the claim of a pending attempt: compare-and-set on its state and fence, the fence + 1
        return update(Attempt.__table__).where(
            at.id == given("attempt_id"), at.state == const("pending", A.PENDING, at.state),
            at.fence == given("old_fence")).values(claimed_at=given("now"), fence=given("new_fence"), state=launching)

    def held(**values: Any) -> ClauseElement:
        """An update of an attempt still launching under this launcher's fence."""
        return update(Attempt.__table__).where(at.id == given("attempt_id"), at.state == launching,
                                               at.fence == given("held_fence")).values(**values)

    return {
        "job_state": lambda: select(Job.state).where(Job.name == given("name")),
        "names_taken": names_taken,
        "any_names_taken": any_names_taken,
        "environment": lambda: select(Environment.id).where(Environment.sha256 == given("sha256")),
        # ON CONFLICT DO NOTHING: two submitters inserting one environment at once both go on (PostgreSQL: the
        # second waits for the first's commit, then reads its row) without a savepoint per insert
        "new_environment": lambda: _insert_of(dialect)(Environment.__table__).values(
            sha256=given("sha256"), vars_json=given("vars_json")).on_conflict_do_nothing(index_elements=["sha256"]),
        "new_job": new_job,
        "new_sweep": lambda: insert(Sweep.__table__).values(
            name=given("name"), backend=given("backend"), throttle=given("throttle"),
            params_json=given("params_json"), created_at=given("now")),
        "sweep_jobs": lambda: select(Job.task_index, Job.id).where(Job.sweep_id == given("sweep_id")),
        "sweep_tasks": lambda: select(Job.task_index, Job.id, Attempt.id).join(Attempt, Attempt.job_id == Job.id)
        .where(Job.sweep_id == given("sweep_id")),
        "new_attempt": new_attempt,
        "event": lambda: insert(Event.__table__).values(
            job_id=given("job_id"), attempt_id=given("attempt_id"), at=given("at"), from_state=given("from_state"),
            to_state=given("to_state"), reason=given("reason")),
        "claim": claim,
        # the group's token on each attempt still launching
        "mark_batch": lambda: update(Attempt.__table__).where(at.id == given("attempt_id"), at.state == launching)
        .values(batch_token=given("batch")),
        "renew": lambda: held(claimed_at=given("now")),
        # a claim still held, right before the backend call: renewed, its generation noted as the one that may submit
        "check_claim": lambda: held(claimed_at=given("now"), launched_fence=given("held_fence")),
        "record": lambda: held(state=const("submitted", A.SUBMITTED, at.state), external_id=given("ext_id"),
                               submitted_at=given("now"), overrides_json=given("overrides")),
        "claim_state": lambda: select(Attempt.state, Attempt.fence, Attempt.external_id, Attempt.batch_token)
        .where(Attempt.id == given("attempt_id")),
        "job_submitted": lambda: update(Job.__table__).where(
            jt.id == given("job_id"), jt.state == const("pending", J.PENDING, jt.state))
        .values(state=const("submitted", J.SUBMITTED, jt.state), updated_at=given("now")),
        # the read commands' quick paths (views.status, views.goodputquick): their queries, as the slow paths run them
        "status": lambda: status_select(),
        "status_in_state": lambda: status_select(given("state")),
        "status_since": lambda: status_select(windowed=True),
        "status_in_state_since": lambda: status_select(given("state"), windowed=True),
        "status_count": lambda: count_select(),
        "status_count_in_state": lambda: count_select(given("state")),
        **{name: (lambda name=name: metrics_selects()[name]) for name in metrics_selects()},
        "report_jobs": lambda: report_selects(False)[0],
        "report_attempts": lambda: report_selects(False)[1],
        "report_jobs_since": lambda: report_selects(True)[0],
        "report_attempts_since": lambda: report_selects(True)[1],
        "mtbf_history": lambda: mtbf.history_select(given("backend"), given("since")),
        "node_failures": lambda: suspects.failures_select(given("backend"), given("since")),
        "node_clears": lambda: suspects.clears_select(given("backend")),
    }


def _insert_of(dialect: str) -> Any:
    """``dialect``'s own INSERT construct (the one with ON CONFLICT); PostgreSQL's imported only when used (29 ms)."""
    return importlib.import_module(f"sqlalchemy.dialects.{dialect}").insert


@functools.cache
def statement(name: str, dialect: str = "sqlite") -> ClauseElement:
    """Statement ``name`` for ``dialect``, built once per process (the SQLAlchemy executor runs the construct)."""
    return _statements(dialect)[name]()


class SessionExecutor:
    """``core/transactions.py``'s executor on a SQLAlchemy session: the constructs themselves, on any database."""

    def __init__(self, session: Any) -> None:
        self.session = session
        dialect = session.get_bind().dialect
        self.dialect, self.counts_batches = dialect.name, dialect.supports_sane_multi_rowcount

    def rowcount(self, statement_name: str, /, **values: Any) -> int:
        n = self.session.execute(statement(statement_name, self.dialect), values,
                                 execution_options={"synchronize_session": False}).rowcount
        testhooks.site(f"sqlalchemy:{statement_name}")  # ran, not committed (as quickdb.run's quick:<statement>)
        return n

    def rowcount_many(self, statement_name: str, rows: Sequence[dict[str, Any]], /) -> int:
        stmt = statement(statement_name, self.dialect)
        if not rows:
            return 0
        if len(rows) == 1 or (not stmt.is_insert and not self.counts_batches):
            return sum(self.rowcount(statement_name, **row) for row in rows)  # a driver that cannot count a batch
        n = self.session.execute(stmt, list(rows), execution_options={"synchronize_session": False}).rowcount
        testhooks.site(f"sqlalchemy:{statement_name}")
        return len(rows) if stmt.is_insert else n  # an insert changes exactly its rows (a driver may say -1)

    def inserted(self, statement_name: str, /, **values: Any) -> int:
        row_id = self.session.execute(statement(statement_name, self.dialect), values).inserted_primary_key[0]
        testhooks.site(f"sqlalchemy:{statement_name}")
        return row_id

    def rows(self, statement_name: str, /, **values: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.session.execute(statement(statement_name, self.dialect), values)]


def compiled(stmt: ClauseElement) -> tuple[str, dict[str, Any]]:
    """(SQLite text with named parameters, its constants as the column types store them); an expanding IN of
    constants (the suspect classes) is rendered one name per value, as SQLAlchemy renders it when it executes."""
    c = stmt.compile(dialect=sqlite.dialect(paramstyle="named"))
    text, constants = str(c), {}
    processors = c._bind_processors  # the column types' own conversions (an enum to its value, JSON to text)
    for bind, name in c.bind_names.items():  # each parameter once, by the name the text uses
        if bind.required:
            continue  # the caller's
        store = processors.get(name, lambda v: v)
        if bind.expanding:
            values = sorted(store(v) for v in bind.value)  # a set's order changes from run to run; IN's does not matter
            names = [f"{name}_{i}" for i in range(1, len(values) + 1)]
            text = text.replace(f"__[POSTCOMPILE_{name}]", ", ".join(f":{n}" for n in names))
            constants.update(zip(names, values, strict=True))
        else:
            constants[name] = store(bind.value)
    return text, constants


def _literal(text: str, indent: str) -> list[str]:
    """``text`` as Python string literals of at most ~100 characters, each on a line of its own."""
    chunks, line = [], ""
    for word in text.split(" "):
        if line and len(json.dumps(line + " " + word)) > 100:
            chunks.append(line + " ")
            line = word
        else:
            line = f"{line} {word}" if line else word
    chunks.append(line)
    return [indent + json.dumps(c) for c in chunks]


def _value(v: Any) -> str:
    return json.dumps(v) if isinstance(v, str) else repr(v)


def generate() -> str:
    """The text of ``core/sqlitetext.py``."""
    out = ['"""Generated by ``python -m orchestrator.ops.statements --write`` from ops/statements.py: do not edit.',
           "",
           "The SQLite text of every statement of the quick path (ops/quicksubmit, ops/quicksweep), with named",
           "parameters; ``CONSTANTS`` holds the values it binds itself (states and model defaults, as the columns",
           'store them). Stdlib only: the quick path imports it without SQLAlchemy.', '"""', "",
           "from typing import Any", "", "SQL: dict[str, str] = {"]
    constants = {}
    for name, build in _statements().items():
        text, consts = compiled(build())
        out += [f"    {json.dumps(name)}: (", *_literal(text, " " * 8), "    ),"]
        if consts:
            constants[name] = consts
    out += ["}", "", "CONSTANTS: dict[str, dict[str, Any]] = {"]
    for name, consts in constants.items():
        items = [f"        {json.dumps(k)}: {_value(v)}," for k, v in sorted(consts.items())]
        out += [f"    {json.dumps(name)}: {{", *items, "    },"]
    out += ["}", "", "# the caller's parameters bound to a JSON column, given as values: stored as JSONType does",
            "JSON_PARAMS: dict[str, tuple[str, ...]] = {"]
    for name, build in _statements().items():
        if params := json_params(build()):
            out.append(f"    {json.dumps(name)}: ({', '.join(json.dumps(p) for p in params)},),")
    out += ["}", ""]
    return "\n".join(out)


def json_params(stmt: ClauseElement) -> list[str]:
    """The caller's parameters of ``stmt`` bound to a JSON column (SQLAlchemy serializes them; sqlite3 cannot)."""
    c = stmt.compile(dialect=sqlite.dialect(paramstyle="named"))
    return sorted(name for bind, name in c.bind_names.items() if bind.required and isinstance(bind.type, JSONType))


def main(argv: list[str]) -> int:
    return write_or_check(argv, lambda: {TARGET: generate()}, "orchestrator.ops.statements")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
