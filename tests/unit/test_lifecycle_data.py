"""``orchestrator/core/lifecycle.py`` is the complete answer to "what can happen to a job or an attempt, and which
function does it": checked against the source by its AST, and against the diagram in docs/. Both executors: the
SQLAlchemy path's calls of lifecycle's movers, and the quick path's runs of the statements that move or create a row
(``ops/statements.MOVES``, whose compiled SQL is checked to write exactly those states)."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

from orchestrator.core import lifecycle
from orchestrator.core.lifecycle import ATTEMPT_BIRTHS, ATTEMPT_EDGES, JOB_BIRTHS, JOB_EDGES, AttemptState, JobState
from orchestrator.ops import statements

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "orchestrator"
MOVERS = {"move_job": "job", "move_attempt": "attempt", "create_job": "job birth", "create_attempt": "attempt birth"}
ROW_CLASSES = {"Job", "Attempt", "Event"}


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        name = ".".join(path.relative_to(PKG).with_suffix("").parts)
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def _called_name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _flat(target: ast.expr) -> list[ast.expr]:
    """The names an assignment target binds (``a, b.state = ...``), never those it only reads (``d[x.state]``)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [s for e in target.elts for s in _flat(e)]
    return _flat(target.value) if isinstance(target, ast.Starred) else [target]


def _state_writes(tree: ast.Module, module: str) -> list[str]:
    """Every place ``tree`` writes a state or constructs a row (each a 'module:line: what')."""
    bad = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for sub in _flat(t):
                # `self.state` is an object's own field (a training loop's state), never a row: models assign none.
                if isinstance(sub, ast.Attribute) and sub.attr == "state" and not (
                        isinstance(sub.value, ast.Name) and sub.value.id == "self" and module != "core.models"):
                    bad.append(f"{module}:{node.lineno}: assigns {ast.unparse(sub)}")
        if isinstance(node, ast.Call):
            name = _called_name(node)
            f = node.func
            row = isinstance(f, ast.Name) or (  # Job(...), models.Job(...); never threading.Event()
                isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "models")
            if name in ROW_CLASSES and row:
                bad.append(f"{module}:{node.lineno}: constructs {name}(...)")
            if name == "setattr" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                    and node.args[1].value == "state":
                bad.append(f"{module}:{node.lineno}: setattr(..., 'state', ...)")
            # ops.statements defines the quick path's SQL: which of it writes a state is checked by compiling it
            if name in ("values", "insert") and any(k.arg == "state" for k in node.keywords) \
                    and module != "ops.statements":
                bad.append(f"{module}:{node.lineno}: writes state= in SQL")
    return bad


def test_no_module_but_lifecycle_writes_a_state_or_constructs_a_row():
    # Covers all of orchestrator/, integrations/ and executor.py included (the line regex it replaces
    # exempted integrations/, though integrations/submitit.py opens the DB).
    offenders = [w for m, tree in _modules().items() if m != "core.lifecycle" for w in _state_writes(tree, m)]
    assert offenders == []


def test_the_ast_check_catches_each_kind_of_write():
    src = ("def f(s, job, a):\n    job.state = 'x'\n    a.state: str = 'y'\n    setattr(a, 'state', 1)\n"
           "    s.add(Attempt(n=1))\n    s.execute(update(Job).values(state='done'))\n    self.state = {}\n"
           "    n[a.state] = 1\n    x, (y, a.state) = 1, (2, 3)\n")
    assert len(_state_writes(ast.parse(src), "somewhere")) == 6
    assert len(_state_writes(ast.parse(src), "core.models")) == 7


def _mover_calls() -> dict[tuple[str, str], set[str | None]]:
    """(mover kind, 'module.function') -> the literal destination states it passes (None: a variable)."""
    out: dict[tuple[str, str], set[str | None]] = {}
    for module, tree in _modules().items():
        if module == "core.lifecycle":
            continue
        for top in tree.body:
            funcs = [top] if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) else [
                f for f in getattr(top, "body", []) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
            for fn in funcs:
                qual = f"{module}.{top.name}" + (f".{fn.name}" if fn is not top else "")
                for node in ast.walk(fn):
                    quick = _quick_move(node)
                    if quick is not None:
                        out.setdefault((quick[0], qual), set()).add(quick[1])
                    elif isinstance(node, ast.Call) and (kind := MOVERS.get(_called_name(node) or "")):
                        dst = None
                        pos = 1 if kind.endswith("birth") else 2
                        if len(node.args) > pos and isinstance(node.args[pos], ast.Attribute):
                            dst = node.args[pos].attr
                        elif kind == "attempt birth":
                            dst = "PENDING"
                        out.setdefault((kind, qual), set()).add(dst)
    return out


# where a runner of a statement names it: quickdb's run(c, "<statement>", ...), an executor's ex.rowcount("<statement>")
_STATEMENT_ARG = {"run": 1, "run_many": 1, "rowcount": 0, "rowcount_many": 0, "inserted": 0, "rows": 0}


def _quick_move(node: ast.AST) -> tuple[str, str] | None:
    """(kind, destination) of a run of a statement that moves or creates a row: the quick path's
    ``run(c, "<statement>", ...)`` / ``run_many(...)``, or an executor's ``ex.rowcount("<statement>", ...)``
    (core/transactions.py, on either path)."""
    at = _STATEMENT_ARG.get(_called_name(node) or "") if isinstance(node, ast.Call) else None
    if at is None or len(node.args) <= at or not isinstance(node.args[at], ast.Constant) \
            or node.args[at].value not in statements.MOVES:
        return None
    kind, state = statements.MOVES[node.args[at].value]
    return kind, state.name


def test_the_quick_statements_that_write_a_state_are_exactly_the_declared_moves():
    """A statement of the quick path that sets a state, or inserts a row with one, is in MOVES with the state it
    writes; one that writes no state is not (a move hidden in a string was invisible to the AST checks)."""
    for name, build in statements._statements().items():
        text, constants = statements.compiled(build())
        param = re.search(r"\bSET (?:\w+=:\w+, )*state=:(\w+)", text)
        insert = re.match(r"INSERT INTO \w+ \(([^)]*)\) VALUES \(([^)]*)\)", text)
        if insert and "state" in (cols := [c.strip() for c in insert.group(1).split(",")]):
            param = re.match(r":(\w+)", insert.group(2).split(",")[cols.index("state")].strip())
        if name in statements.MOVES:
            assert param is not None, f"{name} is declared a move but writes no state"
            assert constants.get(param.group(1)) == statements.MOVES[name][1].value, name
        else:
            assert param is None, f"{name} writes a state: declare it in ops/statements.MOVES"


def _functions(tree: ast.Module, module: str):
    """('module.function' or 'module.Class.method', its node) of every top-level function and method."""
    for top in tree.body:
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{module}.{top.name}", top
        for fn in getattr(top, "body", []) if isinstance(top, ast.ClassDef) else []:
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{module}.{top.name}.{fn.name}", fn


def test_the_transactions_event_rows_are_written_only_beside_a_move_they_declare():
    """lifecycle's movers write each move's event row; the transactions both paths share (``core/transactions.py``)
    write their own, through ``transactions.events`` only. Nothing else runs the ``event`` statement, and each event
    a transaction passes it names a move (src, dst) that lifecycle.py gives that transaction: an event for a move
    nobody declared would be history the state machine never allowed."""
    edges = {(e.taker, e.src.name, e.dst.name) for e in (*JOB_EDGES, *ATTEMPT_EDGES)}
    runners, calls = set(), []
    for module, tree in _modules().items():
        for qual, fn in _functions(tree, module):
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call):
                    continue
                name = _called_name(node)
                at = _STATEMENT_ARG.get(name or "")
                if at is not None and len(node.args) > at and isinstance(node.args[at], ast.Constant) \
                        and node.args[at].value == "event":
                    runners.add(qual)
                if name == "events" and len(node.args) == 4:
                    src, dst = node.args[1], node.args[2]  # events(ex, src, dst, rows): the move its rows record
                    assert isinstance(src, ast.Attribute) and isinstance(dst, ast.Attribute), ast.unparse(node)
                    calls.append((qual, src.attr, dst.attr))
    assert runners == {"core.transactions.events"}
    assert len(calls) == 3, calls
    assert [c for c in calls if c not in edges] == []


def test_a_quick_run_of_a_move_is_seen_as_one():
    call = ast.parse('run(c, "claim", now=1)').body[0].value
    assert _quick_move(call) == ("attempt", "LAUNCHING")
    assert _quick_move(ast.parse('run_many(c, "renew", [])').body[0].value) is None
    assert _quick_move(ast.parse('ex.rowcount("record", now=1)').body[0].value) == ("attempt", "SUBMITTED")
    assert _quick_move(ast.parse('ex.rowcount_many("job_submitted", [])').body[0].value) == ("job", "SUBMITTED")


def _declared() -> dict[str, dict[str, set[str]]]:
    decl: dict[str, dict[str, set[str]]] = {"job": {}, "attempt": {}, "job birth": {}, "attempt birth": {}}
    for kind, edges in (("job", JOB_EDGES), ("attempt", ATTEMPT_EDGES)):
        for e in edges:
            decl[kind].setdefault(e.taker, set()).add(e.dst.name)
    for kind, births in (("job birth", JOB_BIRTHS), ("attempt birth", ATTEMPT_BIRTHS)):
        for b in births:
            decl[kind].setdefault(b.taker, set()).add(b.state.name)
    return decl


def test_every_function_that_moves_or_creates_a_row_is_a_declared_taker_of_what_it_does():
    decl = _declared()
    calls = _mover_calls()
    undeclared = []
    for (kind, fn), dsts in calls.items():
        if fn not in decl[kind]:
            undeclared.append(f"{fn} calls a {kind} mover but takes no {kind} edge in lifecycle.py")
            continue
        for d in dsts - {None}:
            if d not in decl[kind][fn]:
                undeclared.append(f"{fn} moves a {kind} to {d}, an edge lifecycle.py does not give it")
    assert undeclared == []
    for kind, takers in decl.items():
        for fn in takers:
            assert (kind, fn) in calls, f"lifecycle.py names {fn} as a {kind} taker, but it calls no mover"


def test_every_taker_names_a_real_function():
    for e in (*JOB_EDGES, *ATTEMPT_EDGES, *JOB_BIRTHS, *ATTEMPT_BIRTHS):
        module, _, func = e.taker.rpartition(".")
        assert callable(getattr(importlib.import_module(f"orchestrator.{module}"), func)), e.taker


def test_every_state_is_reachable_from_a_birth_and_every_edge_is_declared_once():
    for births, edges, states in ((JOB_BIRTHS, JOB_EDGES, JobState), (ATTEMPT_BIRTHS, ATTEMPT_EDGES, AttemptState)):
        reached = {b.state for b in births}
        while True:
            more = {e.dst for e in edges if e.src in reached} - reached
            if not more:
                break
            reached |= more
        assert reached == set(states)
        keys = [(e.src, e.dst, e.taker) for e in edges]
        assert len(keys) == len(set(keys)), "an edge listed twice for one taker"
        assert all(e.trigger and e.taker for e in edges)


def test_the_checked_in_diagram_is_current():
    # Regenerate: python -m orchestrator.core.lifecycle --mermaid > docs/lifecycle.md
    out = subprocess.run([sys.executable, "-m", "orchestrator.core.lifecycle", "--mermaid"], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout
    assert out == lifecycle.mermaid()
    assert (ROOT / "docs" / "lifecycle.md").read_text() == out, \
        "docs/lifecycle.md is stale: python -m orchestrator.core.lifecycle --mermaid > docs/lifecycle.md"


def test_lifecycle_and_models_import_each_other_in_one_direction_only():
    # models imports the state types (orchestrator.core.states), lifecycle imports models: no cycle, not even a
    # deferred import inside a function (lifecycle imported models lazily to hide one).
    for path in (PKG / "core" / "models.py", PKG / "core" / "states.py"):
        imported = {n.module for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)}
        assert "orchestrator.core.lifecycle" not in imported, path.name
