"""What each part of orchestrator may import: the tree says where code runs, this test holds it to that.

On the controller, ``core`` (the job table, its states and moves, the configuration) imports none of the rest; the
decisions (``decide``) and the read-only views (``views``) import no operation and no CLI: an operation carries out
a decision and a view shows its result, never the other way round.

The in-job parts run on the compute node, in the user's training environment: the job wrapper (``jobside``), the
in-job kit (``kit``), the on-disk formats (``protocol``) and the framework integrations (``integrations``). They
import none of the controller's code, nor SQLAlchemy, Alembic, click or rich: a node that installs only them starts
the wrapper fast and trains without the controller's dependencies. Walks the source (nothing imported); imports at any
depth count, since a function-level import runs on the node as surely as a module-level one.
"""

from __future__ import annotations

import ast
from pathlib import Path

from kitvenv import CONTROLLER_DEPENDENCIES  # the ones a node that installs only orch-kit lacks

ROOT = Path(__file__).resolve().parents[2]

# The stdlib-only modules every part shares: the package itself, domain errors, the test hooks, the flock helper.
SHARED = {"orchestrator", "orchestrator.errors", "orchestrator.testhooks", "orchestrator.filelock"}
# Package -> the orchestrator packages and modules its code may import (its own always).
IN_JOB = {
    "orchestrator.protocol": set(),
    "orchestrator.kit": {"orchestrator", "orchestrator.protocol"},
    "orchestrator.jobside": {*SHARED, "orchestrator.protocol", "orchestrator.kit"},
    "orchestrator.integrations": {"orchestrator", "orchestrator.protocol", "orchestrator.kit"},
}
# The operations: what changes the job table and the run dirs (submit, launch, the reconcile pass, requeue, cancel).
OPS = {"orchestrator.ops"}
# Controller package -> what it may not import (at any depth).
CONTROLLER_MAY_NOT = {
    "orchestrator.core": {*OPS, "orchestrator.decide", "orchestrator.views", "orchestrator.cli",
                          "orchestrator.integrations"},
    "orchestrator.decide": {*OPS, "orchestrator.views", "orchestrator.cli"},
    "orchestrator.views": {*OPS, "orchestrator.cli"},
    "orchestrator.dashboard": {*OPS, "orchestrator.cli"},  # a read-only view in a browser
}
# (module, import) pairs allowed across the line, each for a reason:
CROSSINGS = {
    # ``from orchestrator.integrations.submitit import OrchExecutor`` keeps working in a script that submits and
    # runs its callable (one import for both sides); a module __getattr__ imports the controller only then.
    ("orchestrator.integrations.submitit", "orchestrator.ops.executor"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Every module ``path`` imports, at any depth; ``from pkg import name`` is ``pkg.name`` when that is a module."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            out |= subs or {node.module}
    return out


def allowed(imported: str, package: str, may: set[str]) -> bool:
    if not imported.startswith("orchestrator"):
        return imported.split(".")[0] not in CONTROLLER_DEPENDENCIES
    packages = (package, *(m for m in may if m != "orchestrator"))
    return imported in may or any(imported == p or imported.startswith(p + ".") for p in packages)


def violations(package_imports: dict[str, set[str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for module, imported in package_imports.items():
        package = next((p for p in IN_JOB if module == p or module.startswith(p + ".")), None)
        if package is None:
            continue
        bad = sorted(i for i in imported if not allowed(i, package, IN_JOB[package]) and (module, i) not in CROSSINGS)
        if bad:
            out[module] = bad
    return out


def controller_violations(package_imports: dict[str, set[str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for module, imported in package_imports.items():
        for package, banned in CONTROLLER_MAY_NOT.items():
            if module == package or module.startswith(package + "."):
                bad = sorted(i for i in imported if any(i == b or i.startswith(b + ".") for b in banned))
                if bad:
                    out[module] = bad
    return out


def source_imports() -> dict[str, set[str]]:
    files = [p for p in (ROOT / "orchestrator").rglob("*.py") if "migrations" not in p.parts]
    modules = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, modules) for p in files}


def test_the_in_job_parts_import_no_controller_code_and_no_controller_dependency() -> None:
    graph = source_imports()
    assert {"orchestrator.jobside.wrapper", "orchestrator.kit.run", "orchestrator.integrations.hf"} <= set(graph)
    assert violations(graph) == {}


def test_core_decisions_and_views_import_no_operation_and_no_cli() -> None:
    graph = source_imports()
    assert {"orchestrator.core.models", "orchestrator.decide.policy", "orchestrator.views.show",
            "orchestrator.ops.reconcile"} <= set(graph)
    assert controller_violations(graph) == {}
    assert controller_violations({"orchestrator.views.status": {"orchestrator.ops.reconcile",
                                                                "orchestrator.core.db"}}) == {
        "orchestrator.views.status": ["orchestrator.ops.reconcile"]}
    assert controller_violations({"orchestrator.core.models": {"orchestrator.decide.policy"}}) == {
        "orchestrator.core.models": ["orchestrator.decide.policy"]}


def test_every_crossing_still_exists() -> None:
    """A crossing whose import is gone is removed from CROSSINGS, so a stale exception cannot linger."""
    graph = source_imports()
    assert {c for c in CROSSINGS if c[1] not in graph.get(c[0], set())} == set()


def test_the_layer_check_sees_a_controller_import_at_any_depth() -> None:
    assert violations({"orchestrator.jobside.wrapper": {"orchestrator.core.db"}}) == {
        "orchestrator.jobside.wrapper": ["orchestrator.core.db"]}
    assert violations({"orchestrator.kit.run": {"sqlalchemy.orm"}}) == {"orchestrator.kit.run": ["sqlalchemy.orm"]}
    assert violations({"orchestrator.kit.run": {"orchestrator.testhooks"}}) == {
        "orchestrator.kit.run": ["orchestrator.testhooks"]}
    assert violations({"orchestrator.jobside.wrapper": {"orchestrator.testhooks", "orchestrator.kit.log",
                                                        "torch"}}) == {}
    assert violations({"orchestrator.core.db": {"sqlalchemy"}}) == {}  # the controller may
